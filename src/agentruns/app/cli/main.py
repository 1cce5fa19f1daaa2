"""The commands: ``db``, ``worker``, ``reaper``, ``status``, ``runs``, ``purge`` and ``demo``."""

from __future__ import annotations

import asyncio
import logging
import signal
from datetime import timedelta
from pathlib import Path
from typing import Annotated
from uuid import UUID

import typer
from rich.console import Console, RenderableType
from rich.live import Live

from agentruns.app import container as composition
from agentruns.app.cli import render
from agentruns.app.cli.support import (
    CliError,
    database,
    err,
    guarded,
    load_kinds,
    parse_duration,
    postgres_container,
    settings,
)
from agentruns.app.container import AgentRunsContainer, default_holder
from agentruns.app.demo.runner import DemoConfig, DemoReport
from agentruns.app.demo.session import demo_in_memory, demo_on_postgres
from agentruns.app.demo.view import progress_view, summary_view
from agentruns.app.kinds import RunKinds
from agentruns.app.logs import LogFormat, configure_logging
from agentruns.app.metrics import sample_queue_depth
from agentruns.app.stats import RunStatus
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState

log = logging.getLogger("agentruns.cli")

app = typer.Typer(
    name="agentruns",
    help="Lease long-running AI-agent work to workers on PostgreSQL, and never lose it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The database schema.", no_args_is_help=True)
runs_app = typer.Typer(help="One run.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")

out = Console(highlight=False)

DataDir = Annotated[
    Path | None,
    typer.Option(
        help="Data folder of the embedded PostgreSQL, used when AGENTRUNS_DATABASE_URL is unset "
        "[default: .agentruns/pgdata]",
        show_default=False,
    ),
]
KindRefs = Annotated[
    list[str] | None,
    typer.Option(
        "--kinds",
        help="Run kinds to load, as module:object (a RunKinds, a RunKind, a list of them, or a "
        "callable returning one); repeat for more.",
    ),
]


@app.callback()
def _root(
    log_format: Annotated[str, typer.Option(help="Log lines as json or kv.")] = "kv",
    log_level: Annotated[str, typer.Option(help="Log level.")] = "info",
) -> None:
    if log_format not in ("json", "kv"):
        raise typer.BadParameter("choose json or kv", param_hint="--log-format")
    chosen: LogFormat = "json" if log_format == "json" else "kv"
    if log_level.upper() not in logging.getLevelNamesMapping():
        raise typer.BadParameter("choose debug, info, warning or error", param_hint="--log-level")
    configure_logging(level=log_level.upper(), format=chosen)


# -- db -------------------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(data_dir: DataDir = None) -> None:
    """Migrate the schema to the newest revision."""

    def body() -> None:
        with database(settings(), data_dir) as url:
            head = composition.upgrade_database(url)
        out.print(f"database schema at revision {head} (newest)")

    guarded(body)


@db_app.command("current")
def db_current(data_dir: DataDir = None) -> None:
    """Show the schema's revision and the newest one; exit 1 if it is behind."""

    def body() -> None:
        with database(settings(), data_dir) as url:
            current, head = composition.database_revision(url)
        if current == head:
            out.print(f"database schema at revision {current} (newest)")
            return
        out.print(f"database schema at revision {current or 'none'}; newest is {head}")
        raise CliError("the schema is behind: run `agentruns db upgrade`")

    guarded(body)


# -- worker and reaper ----------------------------------------------------------------------


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)


def _required_kinds(refs: list[str] | None) -> RunKinds:
    registry = load_kinds(refs or [])
    if not registry.names():
        raise CliError("no run kinds: pass --kinds module:object")
    return registry


def _with_metrics(built: AgentRunsContainer, port: int | None) -> None:
    if port is not None:
        built.metrics_backend.override("prometheus")
        composition.serve_metrics(built.metrics(), port)


@app.command()
def worker(
    kinds: KindRefs = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Runs in flight at once [default: settings]")
    ] = None,
    holder: Annotated[
        str | None, typer.Option(help="Holder name on leases [default: host:random]")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port")
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Claim and run the given kinds until SIGTERM or SIGINT, then stop gracefully."""

    def body() -> None:
        config = settings()
        registry = _required_kinds(kinds)
        with database(config, data_dir) as url:
            built = postgres_container(config, url, registry)
            _with_metrics(built, metrics_port)
            asyncio.run(_work(built, holder or default_holder(), concurrency))

    guarded(body)


async def _work(built: AgentRunsContainer, holder: str, concurrency: int | None) -> None:
    config = built.settings()
    running = built.worker(holder=holder, concurrency=concurrency or config.worker_concurrency)
    stop = asyncio.Event()
    _stop_on_signals(stop)
    sampler = asyncio.create_task(
        sample_queue_depth(built.run_stats(), built.stores().scope, built.metrics(), stop, 5.0)
    )
    log.info(
        "worker started",
        extra={"holder": holder, "kinds": ",".join(built.kinds().names())},
    )
    try:
        await running.run(stop, grace=config.shutdown_grace.total_seconds())
    finally:
        stop.set()
        await sampler
        outcomes = {str(key): value for key, value in running.stats.outcomes.items()}
        log.info(
            "worker stopped",
            extra={"holder": holder, "claimed": running.stats.claimed, **outcomes},
        )
        await composition.close(built)


@app.command()
def reaper(
    kinds: KindRefs = None,
    every: Annotated[
        float | None, typer.Option(help="Seconds between ticks [default: lease renewal]")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port")
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Take back expired leases and end overdue runs, every tick, until SIGTERM or SIGINT."""

    def body() -> None:
        config = settings()
        registry = _required_kinds(kinds)
        with database(config, data_dir) as url:
            built = postgres_container(config, url, registry)
            _with_metrics(built, metrics_port)
            asyncio.run(_reap(built, every or config.lease_renewal.total_seconds()))

    guarded(body)


async def _reap(built: AgentRunsContainer, every: float) -> None:
    stop = asyncio.Event()
    _stop_on_signals(stop)
    sampler = asyncio.create_task(
        sample_queue_depth(built.run_stats(), built.stores().scope, built.metrics(), stop, 5.0)
    )
    log.info("reaper started", extra={"every": every})
    try:
        await built.reaper().run(stop, every=every)
    finally:
        stop.set()
        await sampler
        log.info("reaper stopped")
        await composition.close(built)


# -- status, runs, purge --------------------------------------------------------------------


@app.command()
def status(data_dir: DataDir = None) -> None:
    """Runs by state, band, workspace and end reason; expired leases; the oldest due run's
    wait; budget holds."""

    def body() -> None:
        config = settings()
        with database(config, data_dir) as url:
            built = postgres_container(config, url)
            report = asyncio.run(_status(built))
        out.print(render.status(report))

    guarded(body)


async def _status(built: AgentRunsContainer) -> RunStatus:
    try:
        async with built.stores().scope.transaction() as tx:
            found: RunStatus = await built.run_stats().status(tx)
            return found
    finally:
        await composition.close(built)


def _run_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise CliError(f"{text!r} is not a run id (a UUID)") from None


@runs_app.command("show")
def runs_show(run_id: str, data_dir: DataDir = None) -> None:
    """A run, its epochs and its events."""

    def body() -> None:
        config = settings()
        wanted = _run_id(run_id)
        with database(config, data_dir) as url:
            built = postgres_container(config, url)
            shown = asyncio.run(_show(built, wanted))
        out.print(shown)

    guarded(body)


async def _show(built: AgentRunsContainer, run_id: UUID) -> RenderableType:
    try:
        use_cases = built.runs()
        run = await use_cases.get(run_id)
        return render.run(run, await use_cases.events(run_id))
    finally:
        await composition.close(built)


@runs_app.command("cancel")
def runs_cancel(run_id: str, kinds: KindRefs = None, data_dir: DataDir = None) -> None:
    """End a queued or leased run CANCELLED now; its holder stops at its next step.

    A kind with a domain row of its own needs its --kinds, so that its row moves too."""

    def body() -> None:
        config = settings()
        wanted = _run_id(run_id)
        registry = load_kinds(kinds or [])
        with database(config, data_dir) as url:
            built = postgres_container(config, url, registry)
            ended = asyncio.run(_cancel(built, wanted))
        out.print(f"run {ended.id} cancelled at epoch {ended.epoch}")

    guarded(body)


async def _cancel(built: AgentRunsContainer, run_id: UUID) -> AgentRun:
    try:
        use_cases = built.runs()
        run = await use_cases.get(run_id)
        if run.kind not in use_cases.kinds:
            raise CliError(
                f"run {run_id} is of kind {run.kind!r}: load it with --kinds module:object"
            )
        if run.state is AgentRunState.ENDED:
            raise CliError(f"run {run_id} has already ended ({run.end_reason})")
        return await use_cases.cancel(run_id)
    finally:
        await composition.close(built)


@app.command()
def purge(
    older_than: Annotated[
        str, typer.Option(help="Delete runs that ended longer ago than this (7d, 12h, 30m)")
    ] = "7d",
    data_dir: DataDir = None,
) -> None:
    """Delete ended runs (and their events) past the retention."""

    def body() -> None:
        retention = parse_duration(older_than)
        config = settings()
        with database(config, data_dir) as url:
            built = postgres_container(config, url)
            deleted = asyncio.run(_purge(built, retention))
        out.print(f"purged {deleted} runs that ended more than {older_than} ago")

    guarded(body)


async def _purge(built: AgentRunsContainer, retention: timedelta) -> int:
    try:
        return await built.runs().purge(retention)
    finally:
        await composition.close(built)


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
        err.print("agentruns: the demo's runs stay in the database agentruns_demo")
        return report


def main() -> None:
    app()
