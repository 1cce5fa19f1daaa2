"""Putting a demo together: on PostgreSQL with worker processes, or in memory with tasks."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dependency_injector import providers

from agentruns.entrypoints import container as composition
from agentruns.entrypoints.container import AgentRunsContainer
from agentruns.entrypoints.demo.fleet import Fleet, ProcessFleet, TaskFleet
from agentruns.entrypoints.demo.kinds import LEASE, demo_kinds
from agentruns.entrypoints.demo.report import DemoReport
from agentruns.entrypoints.demo.runner import DemoConductor, DemoConfig, Progress
from agentruns.entrypoints.demo.workload import build_workload
from agentruns.entrypoints.settings import AgentRunsSettings

DEMO_DATABASE = "agentruns_demo"


def _settings(url: str | None) -> AgentRunsSettings:
    return AgentRunsSettings(database_url=url, lease=LEASE, poll_interval=0.5)


async def _conduct(
    built: AgentRunsContainer, fleet: Fleet, config: DemoConfig, progress: Progress | None
) -> DemoReport:
    conductor = DemoConductor(
        runs=built.runs(),
        stats=built.run_stats(),
        scope=built.stores().scope,
        fleet=fleet,
        config=config,
        lease=LEASE,
        progress=progress,
    )
    try:
        return await conductor.run(build_workload(scale=config.scale, seed=config.seed))
    finally:
        await composition.close(built)


async def demo_in_memory(config: DemoConfig, progress: Progress | None = None) -> DemoReport:
    """The demo on the in-memory adapters: workers are tasks of this process."""
    built = AgentRunsContainer()
    built.settings.override(providers.Object(_settings(None)))
    built.kinds.override(providers.Object(demo_kinds()))
    fleet = TaskFleet(
        lambda holder: built.worker(
            holder=holder, concurrency=config.concurrency, poll_interval=0.2
        ),
        built.reaper(),
        workers=config.workers,
        reap_every=config.reap_every,
    )
    return await _conduct(built, fleet, config, progress)


def demo_on_postgres(
    config: DemoConfig, server_url: str, log_dir: Path, progress: Progress | None = None
) -> tuple[DemoReport, str]:
    """The demo in a fresh database ``agentruns_demo`` on the server at ``server_url``, with
    worker processes; the report and the demo database's URL."""
    url = composition.fresh_database(server_url, DEMO_DATABASE)
    composition.upgrade_database(url)
    built = AgentRunsContainer()
    settings = _settings(url)
    built.settings.override(providers.Object(settings))
    built.kinds.override(providers.Object(demo_kinds()))
    composition.use_postgres(built, url)
    fleet = ProcessFleet(
        workers=config.workers,
        concurrency=config.concurrency,
        env={
            "AGENTRUNS_DATABASE_URL": url,
            "AGENTRUNS_POLL_INTERVAL": "0.5",
            "AGENTRUNS_SHUTDOWN_GRACE": str(config.grace),
        },
        log_dir=log_dir,
        reap_every=config.reap_every,
    )
    return asyncio.run(_conduct(built, fleet, config, progress)), url
