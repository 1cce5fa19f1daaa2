"""``agentruns demo``: the workload, the live view and the summary."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live

from agentruns.app.stats import RunStatus
from agentruns.entrypoints.cli.root import DataDir, app, out
from agentruns.entrypoints.cli.support import (
    CliError,
    database,
    err,
    guarded,
    settings,
)
from agentruns.entrypoints.demo.report import DemoReport
from agentruns.entrypoints.demo.runner import DemoConfig
from agentruns.entrypoints.demo.session import demo_in_memory, demo_on_postgres
from agentruns.entrypoints.demo.view import progress_view, summary_view
from agentruns.entrypoints.logs import configure_logging

# -- demo -----------------------------------------------------------------------------------


@app.command()
def demo(
    memory: Annotated[
        bool, typer.Option("--memory", help="Use the in-memory adapters, workers as tasks")
    ] = False,
    scale: Annotated[float, typer.Option(min=0.01, help="Workload size (1.0: full)")] = 1.0,
    workers: Annotated[int, typer.Option(min=2, help="Worker processes")] = 3,
    concurrency: Annotated[int, typer.Option(min=1, help="Runs per worker")] = 8,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds")] = 50.0,
    seed: Annotated[int, typer.Option(help="Seed of the workload")] = 7,
    data_dir: DataDir = None,
) -> None:
    """A mixed workload on worker processes with injected faults, a live view, a summary
    and an invariant check (exit 1 if one fails)."""
    config = DemoConfig(
        scale=scale, workers=workers, concurrency=concurrency, seed=seed, timeout=timeout
    )

    def body() -> None:
        log_dir = Path(".agentruns/demo-logs")
        log_dir.mkdir(parents=True, exist_ok=True)
        # Log lines would tear the live view: the demo's own go to a file beside the workers'.
        with (log_dir / "demo.log").open("w") as log_file:
            configure_logging(format="json", stream=log_file)
            report = _demo_live(config, memory, data_dir, log_dir)
        out.print()
        out.print(summary_view(report))
        if not report.ok:
            raise CliError("an invariant failed: see the table above")
        out.print(f"[green]every invariant held[/green] (logs in {log_dir}/)")

    guarded(body)


def _demo_live(
    config: DemoConfig, memory: bool, data_dir: Path | None, log_dir: Path
) -> DemoReport:
    with Live("starting the demo...", console=out, refresh_per_second=4) as live:

        def progress(status: RunStatus, extra: dict[str, object]) -> None:
            live.update(progress_view(status, extra))

        if memory:
            err.print("agentruns: the demo on the in-memory adapters (workers are tasks)")
            return asyncio.run(demo_in_memory(config, progress))
        with database(settings(), data_dir) as server_url:
            report, _ = demo_on_postgres(config, server_url, log_dir, progress)
        where = "" if data_dir is None else f" --data-dir {data_dir}"
        err.print(
            "agentruns: the demo's runs stay in the database agentruns_demo; look at them with\n"
            f"  agentruns status --database agentruns_demo{where}\n"
            f"  agentruns runs list --database agentruns_demo{where}\n"
            f"  agentruns runs show RUN_ID --database agentruns_demo{where}\n"
            "or in a browser (the console extra), at http://127.0.0.1:8300/:\n"
            f"  agentruns console --database agentruns_demo{where} "
            "--kinds agentruns.entrypoints.demo.kinds:KINDS",
            markup=False,
        )
        return report
