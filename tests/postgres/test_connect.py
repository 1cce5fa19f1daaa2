"""``agentruns.connect`` on PostgreSQL: a named server, its schema, a pinned clock, and the
embedded server when no URL is given."""

from __future__ import annotations

import socket
import struct
import threading
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


async def test_a_refused_connection_does_not_suggest_migrating() -> None:
    """``(or connect with migrate=True)`` was added to every refusal, a closed port's too."""
    with pytest.raises(agentruns.StoreUnavailable) as refused:
        await agentruns.connect("postgresql://nobody@127.0.0.1:9/nothing")
    assert "migrate=True" not in str(refused.value)


async def test_a_schema_that_is_not_migrated_suggests_both_ways_to_migrate(empty_url: str) -> None:
    with pytest.raises(agentruns.StoreUnavailable) as refused:
        await agentruns.connect(empty_url, kinds=[NOTE])
    assert str(refused.value) == (
        "the database has no agentruns schema yet: "
        "run `agentruns db upgrade` (or connect with migrate=True)"
    )


def _refusing_server(sqlstate: str, message: str) -> tuple[socket.socket, threading.Thread]:
    """A server that speaks just enough of PostgreSQL's protocol to refuse a login: it declines
    SSL and GSS encryption, reads the startup message and answers a FATAL ErrorResponse."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            while True:
                size = struct.unpack("!I", connection.recv(4, socket.MSG_WAITALL))[0]
                body = connection.recv(size - 4, socket.MSG_WAITALL)
                if size == 8 and struct.unpack("!I", body)[0] in (80877103, 80877104):
                    connection.sendall(b"N")  # no SSL, no GSS: the startup follows in clear
                    continue
                fields = (
                    b"".join(
                        code + text.encode() + b"\0"
                        for code, text in (
                            (b"S", "FATAL"),
                            (b"V", "FATAL"),
                            (b"C", sqlstate),
                            (b"M", message),
                        )
                    )
                    + b"\0"
                )
                connection.sendall(b"E" + struct.pack("!I", len(fields) + 4) + fields)
                return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


async def test_a_bad_password_is_a_refusal_not_an_unreachable_server() -> None:
    listener, thread = _refusing_server("28P01", 'password authentication failed for user "app"')
    port = listener.getsockname()[1]
    try:
        with pytest.raises(agentruns.StoreUnavailable) as refused:
            await agentruns.connect(f"postgresql://app:wrong@127.0.0.1:{port}/app")
    finally:
        thread.join(timeout=10)
        listener.close()
    text = str(refused.value)
    assert text.startswith(f"PostgreSQL at 127.0.0.1:{port}/app refused the connection: ")
    assert 'password authentication failed for user "app"' in text
    assert "cannot reach" not in text
    assert "migrate=True" not in text
    assert "wrong" not in text
