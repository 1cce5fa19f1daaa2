"""``agentruns.connect`` on PostgreSQL: a named server, its schema, a pinned clock, and the
embedded server when no URL is given."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

import agentruns
from agentruns.testing import ManualClock
from tests.postgres_server import empty_database


async def _note(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    yield agentruns.StepEvent("noted", {"text": run.payload["text"]})


NOTE = agentruns.RunKind(agentruns.RunKindPolicy(name="note"), _note)


@pytest.fixture
def empty_url(postgres_server: str) -> Iterator[str]:
    with empty_database(postgres_server) as url:
        yield url


async def test_a_pinned_clock_is_the_time_every_statement_reads(postgres_url: str) -> None:
    clock = ManualClock(datetime(2030, 1, 2, 3, 4, tzinfo=UTC))
    async with agentruns.connect(postgres_url, kinds=[NOTE], clock=clock) as client:
        later = clock.now() + timedelta(minutes=5)
        run = await client.runs.enqueue(
            "note", workspace="acme", subject="s", payload={"text": "hi"}, due_at=later
        )
        assert (run.enqueued_at, run.due_at) == (clock.now(), later)
        worker = client.worker(holder="w")
        assert await worker.claim_and_drive(limit=1) == 0  # not due on the pinned clock
        clock.set(later)
        assert await worker.claim_and_drive(limit=1) == 1
        done = await client.runs.get(run.id)
        assert (done.end_reason, done.ended_at) == (agentruns.TerminationReason.COMPLETED, later)
        page = await client.runs.list_runs(workspace="acme")
        assert [listed.id for listed in page.runs] == [run.id]
        assert client.url == postgres_url


async def test_without_a_clock_the_database_clock_decides(postgres_url: str) -> None:
    async with agentruns.connect(postgres_url, kinds=[NOTE]) as client:
        run = await client.runs.enqueue("note", workspace="acme", subject="s", payload={"text": ""})
        assert abs(run.enqueued_at - datetime.now(UTC)) < timedelta(minutes=1)


async def test_a_schema_that_is_not_migrated_is_refused_until_asked_to_migrate(
    empty_url: str,
) -> None:
    with pytest.raises(agentruns.StoreUnavailable, match="agentruns db upgrade"):
        await agentruns.connect(empty_url, kinds=[NOTE])
    async with agentruns.connect(empty_url, kinds=[NOTE], migrate=True) as client:
        run = await client.runs.enqueue("note", workspace="acme", subject="s", payload={"text": ""})
        assert (await client.runs.get(run.id)).id == run.id


async def test_a_server_that_does_not_answer_is_one_clear_error() -> None:
    with pytest.raises(agentruns.StoreUnavailable, match="cannot reach PostgreSQL"):
        await agentruns.connect("postgresql://nobody@127.0.0.1:9/nothing")


async def test_close_releases_every_connection(postgres_url: str) -> None:
    client = await agentruns.connect(postgres_url, kinds=[NOTE])
    await client.runs.enqueue("note", workspace="acme", subject="s", payload={"text": ""})
    await client.close()
    with psycopg.connect(postgres_url, autocommit=True) as probe:
        others = probe.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    assert others == (0,)


async def test_without_a_url_the_embedded_server_is_started_migrated_and_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTRUNS_DATABASE_URL", raising=False)
    data = tmp_path / "pgdata"
    async with agentruns.connect(kinds=[NOTE], data_dir=data) as client:
        assert client.url is not None
        run = await client.runs.enqueue("note", workspace="acme", subject="s", payload={"text": ""})
        await client.worker(holder="w").claim_and_drive(limit=1)
        assert (await client.runs.get(run.id)).state is agentruns.AgentRunState.ENDED
        url = client.url
    assert (data / "PG_VERSION").is_file()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=3).close()
