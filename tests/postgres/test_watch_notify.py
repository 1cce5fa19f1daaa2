"""Watched runs announce their commits on PostgreSQL, and unwatched runs announce nothing
(ADRs/0030): the worker loop's commits take no notify lock; a lost listening connection makes
every watcher read again, and the watch goes on."""

from __future__ import annotations

import asyncio
import random
from uuid import UUID, uuid4

import psycopg

from agentruns.adapters.clock import SystemClock
from agentruns.adapters.postgres import PostgresFamily
from agentruns.app.runs import AgentRuns
from agentruns.domain.termination import TerminationReason
from examples.review import review_jobs
from tests.contract.kinds import contract_kinds

CHANNEL = "agent_run_watch"


async def _heard(listener: psycopg.AsyncConnection[object], seconds: float) -> list[str]:
    found: list[str] = []
    async for notify in listener.notifies(timeout=seconds):
        if notify.channel == CHANNEL:
            found.append(notify.payload)
    return found


async def _family(url: str) -> tuple[PostgresFamily, AgentRuns]:
    family = PostgresFamily(url, SystemClock())
    kinds = contract_kinds(review_jobs(family))
    return family, AgentRuns(family.stores, kinds, random.Random(7))


async def test_an_unwatched_run_sends_no_notification_and_a_watched_one_does(
    postgres_url: str,
) -> None:
    family, runs = await _family(postgres_url)
    listener = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
    try:
        await listener.execute(f"LISTEN {CHANNEL}")
        await runs.enqueue("chat", workspace="acme", subject="s")
        (run,) = await runs.claim("w1")
        await runs.step_boundary(run.fence, "step", {"n": 1})
        await runs.renew(run.fence)
        assert await _heard(listener, 0.3) == []  # claim, boundary and renewal: silent

        async with family.stores.scope.transaction() as tx:
            await family.stores.runs.watch(tx, run.id, uuid4())
        await runs.step_boundary(run.fence, "step", {"n": 2})
        assert await _heard(listener, 2.0) == [str(run.id)]
        await runs.renew(run.fence)
        assert await _heard(listener, 0.3) == []  # a renewal changes no state: silent
        await runs.end(run.fence, TerminationReason.COMPLETED)
        assert await _heard(listener, 2.0) == [str(run.id)]
    finally:
        await listener.close()
        await family.close()


async def test_one_statement_that_moves_many_runs_announces_each_watched_one_once(
    postgres_url: str,
) -> None:
    """A claim of several runs is one statement: the watched runs among them are announced, each
    once, and the others not (the trigger runs per statement over its transition tables)."""
    family, runs = await _family(postgres_url)
    listener = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
    try:
        enqueued = [await runs.enqueue("chat", workspace="acme", subject=f"s{i}") for i in range(4)]
        watched = {str(run.id) for run in enqueued[:2]}
        async with family.stores.scope.transaction() as tx:
            for run in enqueued[:2]:
                await family.stores.runs.watch(tx, run.id, uuid4())
                await family.stores.runs.watch(tx, run.id, uuid4())  # two watchers, one NOTIFY
        await listener.execute(f"LISTEN {CHANNEL}")
        claimed = await runs.claim("w1", limit=4)
        assert len(claimed) == 4
        heard = await _heard(listener, 2.0)
        assert sorted(heard) == sorted(watched)
        for run in claimed:
            await runs.renew(run.fence)
        assert await _heard(listener, 0.3) == []
    finally:
        await listener.close()
        await family.close()


async def test_a_watcher_removes_its_row_when_it_stops(postgres_url: str) -> None:
    family, runs = await _family(postgres_url)
    try:
        await runs.enqueue("chat", workspace="acme", subject="s")
        (run,) = await runs.claim("w1")
        updates = runs.watch(run.id)
        await anext(updates)
        assert await _watch_rows(postgres_url, run.id) == 1
        await updates.aclose()
        assert await _watch_rows(postgres_url, run.id) == 0
    finally:
        await family.close()


async def _watch_rows(url: str, run_id: UUID) -> int:
    async with await psycopg.AsyncConnection.connect(url) as connection:
        cursor = await connection.execute(
            "SELECT count(*) FROM agent_run_watch WHERE run_id = %s", (run_id,)
        )
        row = await cursor.fetchone()
    return 0 if row is None else int(row[0])


async def test_a_lost_listening_connection_is_reopened_and_the_watch_goes_on(
    postgres_url: str,
) -> None:
    family, runs = await _family(postgres_url)
    try:
        await runs.enqueue("chat", workspace="acme", subject="s")
        (run,) = await runs.claim("w1")
        updates = runs.watch(run.id)
        await anext(updates)
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
            cursor = await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'agentruns' AND query LIKE 'LISTEN%'"
            )
            assert await cursor.fetchall() == [(True,)]  # the one listening connection
        await runs.step_boundary(run.fence, "step", {"n": 1})  # maybe unheard: read again
        async with asyncio.timeout(20):
            update = await anext(updates)
        assert update.seq == 1
        # Heard only once the connection is open again (after the poll interval): nothing else
        # makes the watcher read.
        await runs.step_boundary(run.fence, "step", {"n": 2})
        async with asyncio.timeout(20):
            assert (await anext(updates)).seq == 2
        await updates.aclose()
    finally:
        await family.close()
