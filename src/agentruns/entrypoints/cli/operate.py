"""Commands that run agentruns: ``db upgrade``/``db current``, ``worker``, ``reaper``."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from agentruns.app.metrics import sample_queue_depth
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.cli.root import DataDir, KindRefs, SandboxesRef, app, db_app, out
from agentruns.entrypoints.cli.schedules import start_scheduler
from agentruns.entrypoints.cli.support import (
    CliError,
    database,
    guarded,
    load_sandboxes,
    postgres_container,
    required_kinds,
    settings,
    stop_on_signals,
)
from agentruns.entrypoints.container import AgentRunsContainer, default_holder

log = logging.getLogger("agentruns.cli")

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
        registry = required_kinds(kinds)
        if concurrency is not None:
            # The settings size the connection pool for the worker's slots.
            config = config.model_copy(update={"worker_concurrency": concurrency})
        with database(config, data_dir) as url:
            built = postgres_container(config, url, registry)
            _with_metrics(built, metrics_port)
            asyncio.run(_work(built, holder or default_holder()))

    guarded(body)


async def _work(built: AgentRunsContainer, holder: str) -> None:
    config = built.settings()
    running = built.worker(holder=holder)
    stop = asyncio.Event()
    stop_on_signals(stop)
    sampler = asyncio.create_task(
        sample_queue_depth(built.run_stats(), built.stores().scope, built.metrics(), stop, 5.0)
    )
    log.info(
        "worker started",
        extra={"holder": holder, "kinds": ",".join(built.kinds().names())},
    )
    scheduling = None
    try:
        scheduling = await start_scheduler(built, "worker", stop)
        await running.run(stop, grace=config.shutdown_grace.total_seconds())
    finally:
        stop.set()
        await sampler
        if scheduling is not None:
            await scheduling
        outcomes = {str(key): value for key, value in running.stats.outcomes.items()}
        log.info(
            "worker stopped",
            extra={"holder": holder, "claimed": running.stats.claimed, **outcomes},
        )
        await composition.close(built)


@app.command()
def reaper(
    kinds: KindRefs = None,
    sandboxes: SandboxesRef = None,
    every: Annotated[
        float | None, typer.Option(help="Seconds between ticks [default: lease renewal]")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port")
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Take back expired leases and end overdue runs, every tick, until SIGTERM or SIGINT; with
    --sandboxes, take back and delete the host's idle, unstarted and expired sandboxes too."""

    def body() -> None:
        config = settings()
        registry = required_kinds(kinds)
        hosting = load_sandboxes(sandboxes, registry) if sandboxes is not None else None
        with database(config, data_dir) as url:
            built = postgres_container(config, url, registry, hosting)
            _with_metrics(built, metrics_port)
            tick = every or config.lease_renewal.total_seconds()
            asyncio.run(_reap(built, tick, sandboxes=hosting is not None))

    guarded(body)


async def _reap(built: AgentRunsContainer, every: float, *, sandboxes: bool) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)
    sampler = asyncio.create_task(
        sample_queue_depth(built.run_stats(), built.stores().scope, built.metrics(), stop, 5.0)
    )
    log.info("reaper started", extra={"every": every, "sandboxes": sandboxes})
    scheduling = None
    try:
        scheduling = await start_scheduler(built, "reaper", stop)
        # Both on the same tick and stop: neither needs a leader, so every replica runs both.
        async with asyncio.TaskGroup() as reapers:
            reapers.create_task(built.reaper().run(stop, every=every))
            if sandboxes:
                reapers.create_task(built.sandbox_reaper().run(stop, every=every))
    finally:
        stop.set()
        await sampler
        if scheduling is not None:
            await scheduling
        log.info("reaper stopped")
        await composition.close(built)
