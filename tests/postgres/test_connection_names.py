"""Every connection names its process in ``pg_stat_activity``: a worker's, with its holder (cut
to libpq's 63 bytes), and a host's, as it asks ``agentruns.connect``."""

from __future__ import annotations

import asyncio

import psycopg
from typer.testing import CliRunner

import agentruns
from agentruns.adapters.postgres.connections import libpq_url
from agentruns.entrypoints.cli import app
from tests.postgres.probe_kinds import KINDS


async def _enqueue(url: str) -> agentruns.AgentRun:
    async with agentruns.connect(url, kinds=KINDS) as client:
        return await client.runs.enqueue(
            "probe", workspace="acme", subject="s", payload={"url": libpq_url(url)}
        )


async def _seen(url: str, run: agentruns.AgentRun) -> tuple[str | None, object]:
    async with agentruns.connect(url, kinds=KINDS) as client:
        [seen] = await client.runs.events(run.id)
        return (await client.runs.get(run.id)).holder, seen.data["names"]


def test_a_workers_connections_carry_its_name_and_holder(postgres_url: str) -> None:
    """The worker command (in this process: it runs its own event loop) drives a run whose
    step lists who else is connected."""
    holder = "worker-host:" + "x" * 60  # the name is longer than libpq sends
    run = asyncio.run(_enqueue(postgres_url))
    result = CliRunner().invoke(
        app,
        ["worker", "--kinds", "tests.postgres.probe_kinds:KINDS", "--holder", holder, "--drain"],
        env={"AGENTRUNS_DATABASE_URL": postgres_url},
    )
    assert result.exit_code == 0, result.output
    expected = f"agentruns-worker:{holder}".encode()[:63].decode()
    seen_holder, names = asyncio.run(_seen(postgres_url, run))
    assert seen_holder == holder
    # The engine's, the claims' pool's and the listener's connections: all named alike.
    assert isinstance(names, list)
    assert len(names) >= 3
    assert set(names) == {expected}


async def test_a_host_names_its_connections(postgres_url: str) -> None:
    async with agentruns.connect(postgres_url, application_name="myapp-web") as client:
        await client.runs.list_runs()
        with psycopg.connect(libpq_url(postgres_url), autocommit=True) as probe:
            rows = probe.execute(
                "SELECT DISTINCT application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
    assert rows == [("myapp-web",)]
