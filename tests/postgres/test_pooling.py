"""Through a transaction pooler: no server-side prepared statement and no session SET, wake-ups
on a direct listen URL or by polling, said once; the same on a real PgBouncer in transaction
mode, where the defaults break (the control that shows the setting is needed)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import make_url, text

import agentruns
from agentruns.adapters.postgres import PostgresDatabase, PostgresNotifier
from agentruns.adapters.postgres.connections import ConnectionOptions
from agentruns.adapters.postgres.database import fetch
from agentruns.app.ports import TransactionScope
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.settings import AgentRunsSettings
from tests.pgbouncer import pgbouncer
from tests.postgres_server import empty_database


async def _note(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    yield agentruns.StepEvent("noted", {"n": run.payload["n"]})


NOTE = agentruns.RunKind(agentruns.RunKindPolicy(name="note"), _note)


def _with(url: str, **query: str) -> str:
    return make_url(url).update_query_dict(query).render_as_string(hide_password=False)


def _on(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


async def _session(scope: TransactionScope) -> list[tuple[Any, Any]]:
    """Prepared statements and plan_cache_mode, as each of the scope's sessions sees them."""
    found = []
    query = text(
        "SELECT (SELECT count(*) FROM pg_prepared_statements) AS prepared,"
        " current_setting('plan_cache_mode') AS mode"
    )
    async with scope.transaction() as tx:
        [row] = await fetch(tx, query, {})
        found.append((row["prepared"], row["mode"]))
    async with scope.statement() as alone:
        [row] = await fetch(alone, query, {})
        found.append((row["prepared"], row["mode"]))
    return found


async def _work_through(client: agentruns.AgentRunsClient, runs: int) -> None:
    for n in range(runs):
        await client.runs.enqueue("note", workspace=f"w{n % 3}", subject=f"s{n}", payload={"n": n})
    worker = client.worker(holder="pooled", concurrency=4)
    while await worker.claim_and_drive(limit=4):
        pass
    page = await client.runs.list_runs(kind="note", limit=runs)
    assert {run.end_reason for run in page.runs} == {agentruns.TerminationReason.COMPLETED}
    assert len(page.runs) == runs


@pytest.mark.parametrize(
    ("how", "prepared", "mode"),
    [
        ("none", True, "force_generic_plan"),
        ("setting", False, "auto"),
        ("url", False, "auto"),
    ],
)
async def test_a_transaction_pooled_database_prepares_nothing_and_sets_nothing(
    postgres_url: str, how: str, prepared: bool, mode: str
) -> None:
    """After claims, steps and ends, each session has prepared statements and the generic-plan
    SET by default, and neither with the pooler set (in the settings or in the URL)."""
    url = _with(postgres_url, agentruns_pooler="transaction") if how == "url" else postgres_url
    settings = AgentRunsSettings(pooler="transaction" if how == "setting" else "none")
    async with agentruns.connect(url, kinds=[NOTE], settings=settings) as client:
        await _work_through(client, 6)
        sessions = await _session(client.family.stores.scope)
    assert [(count > 0, setting) for count, setting in sessions] == [(prepared, mode)] * 2


async def test_a_pooled_notifier_without_a_listen_url_polls_and_says_so_once(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    options = ConnectionOptions(pooler="transaction", poll_interval=2.0)
    notifier = PostgresNotifier(postgres_url, options)
    caplog.set_level(logging.WARNING, logger="agentruns.notifier")
    try:
        assert not notifier.listens
        assert await notifier.listen() is False
        for _ in range(3):
            assert await notifier.wait(0.01) is False  # slept out: polling
    finally:
        await notifier.close()
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1, warnings
    assert "wake-ups fall back to polling every 2 s" in warnings[0]
    assert "AGENTRUNS_LISTEN_URL" in warnings[0]


async def test_a_direct_notifier_says_nothing(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = PostgresNotifier(postgres_url, ConnectionOptions())
    caplog.set_level(logging.WARNING, logger="agentruns.notifier")
    try:
        assert await notifier.listen() is True
    finally:
        await notifier.close()
    assert caplog.records == []


# -- a real PgBouncer in transaction mode ------------------------------------------------------


@pytest.fixture(scope="module")
def bouncer(postgres_server: str) -> Iterator[str]:
    with pgbouncer(postgres_server) as url:
        yield url


def _server_session(url: str) -> tuple[Any, ...]:
    """What a fresh client of the pooler finds on the one server connection it shares."""
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as probe:
        row = probe.execute(
            "SELECT (SELECT count(*) FROM pg_prepared_statements),"
            " current_setting('plan_cache_mode')"
        ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize("pooler", ["none", "transaction"])
async def test_through_pgbouncer_the_defaults_break(
    bouncer: str, postgres_url: str, pooler: str
) -> None:
    """The control: by default a process's session SET stays on the server connection for the
    next client, and two clients' prepared statements collide by name there; with the
    pooler set, neither happens."""
    url = _on(bouncer, make_url(postgres_url).database or "")
    options = ConnectionOptions(pooler="transaction" if pooler == "transaction" else "none")
    database = PostgresDatabase(url, options=options)
    try:
        async with database.transaction() as tx:
            await fetch(tx, text("SELECT 1 AS one"), {})
    finally:
        await database.dispose()
    leaked = _server_session(url)[1] == "force_generic_plan"
    kwargs = options.connect_kwargs()
    collided = False
    with (
        psycopg.connect(url, autocommit=True, **kwargs) as one,
        psycopg.connect(url, autocommit=True, **kwargs) as other,
    ):
        one.execute("SELECT 1")
        try:
            other.execute("SELECT 1")
        except psycopg.errors.DuplicatePreparedStatement:
            collided = True
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as reset:
        reset.execute("DISCARD ALL")  # the next test gets a clean server connection
    assert (leaked, collided) == ((True, True) if pooler == "none" else (False, False))


async def test_through_pgbouncer_with_the_pooler_set_runs_work_and_wakes_on_a_direct_url(
    bouncer: str, postgres_url: str
) -> None:
    url = _with(_on(bouncer, make_url(postgres_url).database or ""), agentruns_pooler="transaction")
    settings = AgentRunsSettings(listen_url=postgres_url)
    async with agentruns.connect(url, kinds=[NOTE], settings=settings) as client:
        await _work_through(client, 12)
        notifier = client.family.stores.notifier
        assert isinstance(notifier, PostgresNotifier)
        assert await notifier.listen()
        waiter = asyncio.create_task(notifier.wait(60.0))
        await client.runs.enqueue("note", workspace="w", subject="wake", payload={"n": 0})
        async with asyncio.timeout(30):  # the wait itself would take 60 s
            assert await waiter is True
    assert _server_session(_on(bouncer, make_url(postgres_url).database or "")) == (0, "auto")


def test_through_pgbouncer_db_upgrade_migrates(bouncer: str, postgres_server: str) -> None:
    with empty_database(postgres_server) as empty:
        url = _with(_on(bouncer, make_url(empty).database or ""), agentruns_pooler="transaction")
        options = composition.connection_options(AgentRunsSettings(), "agentruns-cli")
        head = composition.upgrade_database(url, AgentRunsSettings(), options=options)
        assert composition.database_revision(url, options) == (head, head)
