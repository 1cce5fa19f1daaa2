"""Claims that are their own transactions take turns (ADRs/0038): a worker's claim waits for
another under way to commit, then takes what it left, in claim order; a claim inside a longer
transaction never waits for one."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import psycopg
from sqlalchemy import text

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.adapters.postgres.database import PostgresTransaction
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.ports import ClaimRequest
from agentruns.app.runs import AgentRuns
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from tests.postgres.helpers import some_session_waits_on_a_lock

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

# 240 runs over 6 workspaces and 60 subjects (four runs each), mixed bands, all due: through the
# table's triggers, as an enqueue writes them.
QUEUE = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt,
                       enqueued_at, due_at, lease)
SELECT gen_random_uuid(), 'turns', 'ws-' || (i %% 6), 'subject-' || (i %% 60), i %% 3, '{}'::jsonb,
       'queued', 0, 0, %(now)s, %(now)s - (i || ' seconds')::interval, interval '30 seconds'
FROM generate_series(1, 240) AS i ORDER BY i
"""

CLAIM = "SELECT id FROM agent_claim(%s, interval '10 minutes', %s, %s, %s)"


async def _no_step(run: AgentRun) -> AsyncIterator[StepEvent]:
    return
    yield  # pragma: no cover - makes this an async generator


def _queue(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(QUEUE, {"now": NOW})


async def _claim(
    connection: psycopg.AsyncConnection, holder: str, limit: int, alone: bool
) -> set[str]:
    cursor = await connection.execute(CLAIM, (NOW, holder, limit, alone))
    return {str(row[0]) for row in await cursor.fetchall()}


async def _connect(url: str, *, autocommit: bool = False) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(url, autocommit=autocommit)


async def test_a_claim_that_is_its_own_transaction_waits_for_the_one_under_way(
    postgres_url: str,
) -> None:
    _queue(postgres_url)
    async with await _connect(postgres_url) as reference:
        # What one claim of 40 would take, rolled back: the two turns must take exactly that.
        expected = await _claim(reference, "reference", 40, True)
        await reference.rollback()
    async with (
        await _connect(postgres_url) as first,
        await _connect(postgres_url, autocommit=True) as second,
    ):
        taken = await _claim(first, "first", 20, True)  # its transaction, and its turn, open
        later = asyncio.create_task(_claim(second, "second", 20, True))
        await some_session_waits_on_a_lock(postgres_url, "advisory")
        assert not later.done()
        await first.commit()
        then = await asyncio.wait_for(later, 30)
    assert len(taken) == len(then) == 20
    assert taken.isdisjoint(then)
    assert taken | then == expected


async def test_a_claim_inside_a_longer_transaction_or_within_the_margin_does_not_wait(
    postgres_url: str,
) -> None:
    _queue(postgres_url)
    async with (
        await _connect(postgres_url) as first,
        await _connect(postgres_url) as inside,
        await _connect(postgres_url) as small,
    ):
        taken = await _claim(first, "first", 20, True)
        # A wait for the turn would fail here: neither claim may take it.
        await inside.execute("SET LOCAL lock_timeout = '1s'")
        beside = await _claim(inside, "inside", 20, False)
        await small.execute("SET LOCAL lock_timeout = '1s'")
        few = await _claim(small, "small", 8, True)
        for connection in (small, inside, first):
            await connection.commit()
    assert (len(taken), len(beside), len(few)) == (20, 20, 8)
    assert len(taken | beside | few) == 48


async def test_a_workers_claim_takes_its_turn_and_a_claim_in_a_transaction_does_not(
    postgres_url: str,
) -> None:
    """Through the adapter: a worker's claim (its own statement) waits for the turn; the store's
    claim inside a transaction of the caller's goes ahead."""
    _queue(postgres_url)
    kinds = RunKinds([RunKind(RunKindPolicy(name="turns", lease=timedelta(seconds=30)), _no_step)])
    stores = make_postgres_stores(postgres_url, None)
    runs = AgentRuns(stores, kinds, random.Random(0))
    try:
        async with await _connect(postgres_url) as first:
            taken = await _claim(first, "first", 20, True)
            async with stores.scope.transaction() as tx:
                assert isinstance(tx, PostgresTransaction)
                await tx.connection.execute(text("SET LOCAL lock_timeout = '1s'"))
                inside = await stores.runs.claim(tx, ClaimRequest(holder="inside", limit=20))
            worker = asyncio.create_task(runs.claim("worker", limit=20, kinds=["turns"]))
            await some_session_waits_on_a_lock(postgres_url, "advisory")
            assert not worker.done()
            await first.commit()
            claimed = await asyncio.wait_for(worker, 30)
    finally:
        await close_postgres_stores(stores)
    ids = [{str(run.id) for run in inside}, {str(run.id) for run in claimed}, taken]
    assert [len(found) for found in ids] == [20, 20, 20]
    assert len(set().union(*ids)) == 60
