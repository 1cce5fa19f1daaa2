"""Wake-up on PostgreSQL: NOTIFY on ``agent_run`` reaches a listener on its own connection."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from uuid import uuid4

import psycopg

from agentruns.adapters.postgres import (
    PostgresNotifier,
    close_postgres_stores,
    make_postgres_stores,
)
from agentruns.app.ports import NewRun
from agentruns.domain.bands import Band


def _new_run() -> NewRun:
    return NewRun(
        id=uuid4(),
        kind="chat",
        workspace="acme",
        subject="s",
        band=Band.BATCH,
        payload={},
        lease=timedelta(seconds=30),
    )


async def test_an_enqueue_wakes_a_listening_waiter(postgres_url: str) -> None:
    stores = make_postgres_stores(postgres_url)
    notifier = stores.notifier
    assert isinstance(notifier, PostgresNotifier)
    try:
        assert await notifier.listen()
        waiter = asyncio.create_task(notifier.wait(60.0))
        async with stores.scope.transaction() as tx:
            await stores.runs.insert(tx, _new_run())
        async with asyncio.timeout(30):  # a safety net; the wait itself would take 60 s
            assert await waiter is True
    finally:
        await close_postgres_stores(stores)


async def test_a_wake_up_sent_while_nobody_waits_is_kept(postgres_url: str) -> None:
    stores = make_postgres_stores(postgres_url)
    notifier = stores.notifier
    assert isinstance(notifier, PostgresNotifier)
    try:
        assert await notifier.listen()
        async with stores.scope.transaction() as tx:
            await stores.runs.insert(tx, _new_run())
        assert await notifier.wait(60.0) is True
        assert await notifier.wait(0.01) is False  # nothing more was queued
    finally:
        await close_postgres_stores(stores)


async def test_a_rolled_back_enqueue_wakes_nobody(postgres_url: str) -> None:
    stores = make_postgres_stores(postgres_url)
    notifier = stores.notifier
    assert isinstance(notifier, PostgresNotifier)
    try:
        assert await notifier.listen()
        async with await psycopg.AsyncConnection.connect(postgres_url) as raw:
            await raw.execute("SELECT pg_notify('other', 'x')")
            await raw.rollback()
        assert await notifier.wait(0.05) is False
    finally:
        await close_postgres_stores(stores)


async def test_the_first_wait_claims_at_once_since_it_cannot_know_what_it_missed(
    postgres_url: str,
) -> None:
    notifier = PostgresNotifier(postgres_url)
    try:
        assert await notifier.wait(60.0) is True
    finally:
        await notifier.close()


async def test_an_unreachable_server_falls_back_to_polling() -> None:
    notifier = PostgresNotifier("postgresql://nobody@/nowhere?host=/nonexistent-socket-dir")
    assert await notifier.wait(0.01) is False
    await notifier.close()


async def test_cancels_are_heard_on_the_one_listening_connection_and_wake_nobody(
    postgres_url: str,
) -> None:
    """The notifier listens on both channels on one connection; a cancel sent while a waiter
    waits goes to the cancel subscribers and the wait goes on (no claim for a cancel), until a
    wake-up or the wait's time."""
    stores = make_postgres_stores(postgres_url)
    notifier = stores.notifier
    assert isinstance(notifier, PostgresNotifier)
    told: list[object] = []
    unsubscribe = notifier.on_cancel(told.append)
    run_id = uuid4()
    try:
        assert await notifier.listen()
        with psycopg.connect(postgres_url, autocommit=True) as other:
            rows = other.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN %'"
            ).fetchall()
            assert rows == [(1,)]
            waiter = asyncio.create_task(notifier.wait(0.5))
            await asyncio.sleep(0.05)
            other.execute("SELECT pg_notify('agent_run_cancel', %s)", (str(run_id),))
            async with asyncio.timeout(30):
                assert await waiter is False  # a cancel is no wake-up: the wait ran its time
        assert told == [run_id]
        unsubscribe()
        with psycopg.connect(postgres_url, autocommit=True) as other:
            other.execute("SELECT pg_notify('agent_run_cancel', %s)", (str(uuid4()),))
        assert await notifier.wait(0.2) is False
        assert told == [run_id]  # unsubscribed: told no more
    finally:
        await close_postgres_stores(stores)
