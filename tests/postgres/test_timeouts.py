"""Time bounds: an operator's read under AGENTRUNS_READ_TIMEOUT (the CLI's one line, the
console's page), every statement under AGENTRUNS_STATEMENT_TIMEOUT (cancelled on the server
too), and ``db upgrade`` under AGENTRUNS_MIGRATION_LOCK_TIMEOUT, retried, never half-applied."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import psycopg
import pytest
from typer.testing import CliRunner, Result

import agentruns
from agentruns.adapters.postgres import admin
from agentruns.adapters.postgres.connections import libpq_url
from agentruns.adapters.postgres.migrate import migrate
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.cli import app
from agentruns.entrypoints.cli.support import postgres_container
from agentruns.entrypoints.settings import AgentRunsSettings
from tests.postgres_server import empty_database

EARLIER = "0011_claim_margin"  # the next revision, 0012, drops and creates agent_run's triggers


async def _note(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    yield agentruns.StepEvent("noted")


NOTE = agentruns.RunKind(agentruns.RunKindPolicy(name="note"), _note)


@pytest.fixture
def locked(postgres_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """agent_run locked against every reader (as a DDL statement in flight would have it)."""
    with psycopg.connect(libpq_url(postgres_url)) as holder:
        holder.execute("LOCK TABLE agent_run IN ACCESS EXCLUSIVE MODE")
        yield holder
        holder.rollback()


def _invoke(url: str, *args: str, **env: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"AGENTRUNS_DATABASE_URL": url, **env})


def _stderr_lines(result: Result) -> list[str]:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.stderr.strip().splitlines()


# -- reads --------------------------------------------------------------------------------------


@pytest.mark.usefixtures("locked")
async def test_an_operators_read_past_the_read_timeout_is_cancelled(postgres_url: str) -> None:
    config = AgentRunsSettings(read_timeout="200ms")  # type: ignore[arg-type]
    built = postgres_container(config, postgres_url, process="cli")
    started = time.monotonic()
    try:
        with pytest.raises(agentruns.DatabaseTimeout, match=r"after 0\.2 s") as timed_out:
            await built.runs().list_runs()
    finally:
        await composition.close(built)
    assert timed_out.value.seconds == 0.2
    assert time.monotonic() - started < 5


@pytest.mark.usefixtures("locked")
async def test_a_workers_transactions_carry_no_read_timeout(postgres_url: str) -> None:
    config = AgentRunsSettings(read_timeout="200ms", statement_timeout="1s")  # type: ignore[arg-type]
    built = postgres_container(config, postgres_url, process="worker", holder="w")
    try:
        with pytest.raises(agentruns.DatabaseTimeout, match="within 1 s"):  # the client's
            await built.runs().list_runs()
    finally:
        await composition.close(built)


@pytest.mark.usefixtures("locked")
@pytest.mark.parametrize(
    "command",
    [["runs", "list"], ["status"], ["runs", "show", "0" * 8 + "-0000-0000-0000-" + "0" * 12]],
)
def test_a_timed_out_read_is_one_line_on_stderr_and_exit_1(
    postgres_url: str, command: list[str]
) -> None:
    result = _invoke(postgres_url, *command, AGENTRUNS_READ_TIMEOUT="200ms")
    [line] = _stderr_lines(result)
    assert line.startswith("agentruns: error: PostgreSQL cancelled a statement after 0.2 s"), line
    assert "statement timeout" in line


async def test_a_timed_out_read_is_a_clear_page_in_the_console(
    postgres_url: str, locked: psycopg.Connection[tuple[object, ...]]
) -> None:
    config = AgentRunsSettings(read_timeout="200ms")  # type: ignore[arg-type]
    client = agentruns.AgentRunsClient(
        postgres_container(config, postgres_url, process="console"), url=postgres_url
    )
    console = agentruns.create_console(client)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=console),  # type: ignore[arg-type]
            base_url="http://localhost",
        ) as http:
            for path in ("/", "/runs", "/workspaces", "/live/overview"):
                page = await http.get(path)
                assert page.status_code == 503, (path, page.text)
                assert "did not answer within 0.2 s" in page.text, page.text
            locked.rollback()  # the lock goes: the same page reads again
            assert (await http.get("/runs")).status_code == 200
    finally:
        await client.close()


# -- every statement: the client's bound ----------------------------------------------------------


async def test_a_write_blocked_past_the_statement_bound_is_cancelled_on_the_server(
    postgres_url: str,
) -> None:
    settings = AgentRunsSettings(statement_timeout="300ms")  # type: ignore[arg-type]
    async with agentruns.connect(postgres_url, kinds=[NOTE], settings=settings) as client:
        await client.runs.enqueue("note", workspace="acme", subject="s")
        [run] = await client.runs.claim("w")
        with psycopg.connect(libpq_url(postgres_url)) as blocker:
            blocker.execute("SELECT 1 FROM agent_run WHERE id = %s FOR UPDATE", [run.id])
            started = time.monotonic()
            with pytest.raises(agentruns.DatabaseTimeout, match=r"within 0\.3 s"):
                await client.runs.renew(run.fence)
            assert time.monotonic() - started < 5
            waiting = blocker.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'agentruns'"
                " AND state = 'active'"
            ).fetchone()
            assert waiting == (0,)  # cancelled on the server, not only abandoned
            blocker.rollback()
        renewed = await client.runs.renew(run.fence)  # the connection is usable again
        assert renewed.leased_until is not None


# -- migrations ---------------------------------------------------------------------------------


@pytest.fixture
def behind(postgres_server: str) -> Iterator[str]:
    """A database at an earlier revision than the newest."""
    with empty_database(postgres_server) as url:
        migrate(url, EARLIER)
        yield url


@pytest.fixture
def reader(behind: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A long reader: a transaction that has read agent_run and is not done."""
    with psycopg.connect(libpq_url(behind)) as reading:
        reading.execute("SELECT count(*) FROM agent_run")
        yield reading
        reading.rollback()


def _settings(lock_timeout: str, attempts: int) -> AgentRunsSettings:
    return AgentRunsSettings(
        migration_lock_timeout=lock_timeout,  # type: ignore[arg-type]
        migration_attempts=attempts,
    )


def test_a_migration_behind_a_long_reader_gives_up_and_changes_nothing(
    behind: str, reader: psycopg.Connection[tuple[object, ...]]
) -> None:
    with pytest.raises(agentruns.DatabaseTimeout) as gave_up:
        composition.upgrade_database(behind, _settings("200ms", 1))
    message = str(gave_up.value)
    assert "waited more than 0.2 s for a lock" in message
    assert f"stays at revision {EARLIER}" in message
    assert "attempt 1 of 1" in message
    assert admin.schema_revision(behind)[0] == EARLIER
    reader.rollback()  # the reader is done: the same upgrade goes through
    head = composition.upgrade_database(behind, _settings("200ms", 1))
    assert admin.schema_revision(behind) == (head, head)


def test_a_migration_tries_again_after_a_backoff(
    behind: str, reader: psycopg.Connection[tuple[object, ...]]
) -> None:
    told: list[str] = []
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 2:
            reader.rollback()  # the reader finishes during the second backoff

    head = composition.upgrade_database(
        behind, _settings("200ms", 5), retrying=told.append, sleep=sleep
    )
    assert admin.schema_revision(behind) == (head, head)
    assert slept == [1.0, 2.0]
    assert [line.rsplit("; ", 1)[1] for line in told] == [
        "attempt 1 of 5, trying again in 1 s",
        "attempt 2 of 5, trying again in 2 s",
    ]


@pytest.mark.usefixtures("reader")
def test_db_upgrade_says_each_retry_on_stderr_and_fails_in_one_line(behind: str) -> None:
    result = _invoke(
        behind,
        "db",
        "upgrade",
        AGENTRUNS_MIGRATION_LOCK_TIMEOUT="200ms",
        AGENTRUNS_MIGRATION_ATTEMPTS="2",
    )
    retried, failed = _stderr_lines(result)
    assert retried.startswith("agentruns: the migration waited more than 0.2 s"), retried
    assert retried.endswith("attempt 1 of 2, trying again in 1 s"), retried
    assert failed.startswith("agentruns: error: the migration waited more than 0.2 s"), failed
    assert "attempt 2 of 2" in failed
    assert admin.schema_revision(behind)[0] == EARLIER


def test_a_migration_does_not_hold_up_readers_past_its_lock_timeout(
    behind: str, reader: psycopg.Connection[tuple[object, ...]]
) -> None:
    """While it waits, the migration's lock request queues the readers after it; once its
    lock_timeout runs out they go on, whatever the first reader does."""

    async def later_reader() -> float:
        await asyncio.sleep(0.1)  # after the migration has queued its lock
        started = time.monotonic()
        async with await psycopg.AsyncConnection.connect(libpq_url(behind)) as other:
            await other.execute("SELECT count(*) FROM agent_run")
        return time.monotonic() - started

    async def both() -> float:
        upgrading = asyncio.create_task(
            asyncio.to_thread(composition.upgrade_database, behind, _settings("500ms", 1))
        )
        waited = await later_reader()
        with pytest.raises(agentruns.DatabaseTimeout):
            await upgrading
        return waited

    assert asyncio.run(both()) < 3  # not as long as the first reader holds on
