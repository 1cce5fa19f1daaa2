"""Claims that are their own transactions take turns (ADRs/0038): a worker's claim waits for
another under way to commit, then takes what it left, in claim order; a claim inside a longer
transaction never waits for one."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
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


def _claim(connection: psycopg.Connection, holder: str, limit: int, alone: bool) -> set[str]:
    rows = connection.execute(CLAIM, (NOW, holder, limit, alone)).fetchall()
    return {str(row[0]) for row in rows}


def _waiting_on_advisory_lock(watch: psycopg.Connection, pid: int) -> bool:
    row = watch.execute(
        "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row == ("Lock", "advisory")


def _until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def test_a_claim_that_is_its_own_transaction_waits_for_the_one_under_way(
    postgres_url: str,
) -> None:
    _queue(postgres_url)
    with psycopg.connect(postgres_url) as reference:
        # What one claim of 40 would take, rolled back: the two turns must take exactly that.
        expected = _claim(reference, "reference", 40, True)
        reference.rollback()
    with (
        psycopg.connect(postgres_url) as first,
        psycopg.connect(postgres_url, autocommit=True) as second,
        psycopg.connect(postgres_url, autocommit=True) as watch,
        ThreadPoolExecutor(1) as pool,
    ):
        taken = _claim(first, "first", 20, True)  # its transaction, and its turn, still open
        later = pool.submit(_claim, second, "second", 20, True)
        _until(lambda: _waiting_on_advisory_lock(watch, second.info.backend_pid))
        assert not later.done()
        first.commit()
        then = later.result(timeout=30)
    assert len(taken) == len(then) == 20
    assert taken.isdisjoint(then)
    assert taken | then == expected


def test_a_claim_inside_a_longer_transaction_or_within_the_margin_does_not_wait(
    postgres_url: str,
) -> None:
    _queue(postgres_url)
    with (
        psycopg.connect(postgres_url) as first,
        psycopg.connect(postgres_url) as inside,
        psycopg.connect(postgres_url) as small,
    ):
        taken = _claim(first, "first", 20, True)
        # A wait for the turn would fail here: neither claim may take it.
        inside.execute("SET LOCAL lock_timeout = '1s'")
        beside = _claim(inside, "inside", 20, False)
        small.execute("SET LOCAL lock_timeout = '1s'")
        few = _claim(small, "small", 8, True)
        for connection in (small, inside, first):
            connection.commit()
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
        with (
            psycopg.connect(postgres_url) as first,
            psycopg.connect(postgres_url, autocommit=True) as watch,
        ):
            taken = _claim(first, "first", 20, True)
            async with stores.scope.transaction() as tx:
                assert isinstance(tx, PostgresTransaction)
                await tx.connection.execute(text("SET LOCAL lock_timeout = '1s'"))
                inside = await stores.runs.claim(tx, ClaimRequest(holder="inside", limit=20))
            worker = asyncio.create_task(runs.claim("worker", limit=20, kinds=["turns"]))
            await asyncio.to_thread(
                _until,
                lambda: (
                    watch.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
                    ).fetchone()
                    == (1,)
                ),
            )
            assert not worker.done()
            first.commit()
            claimed = await asyncio.wait_for(worker, 30)
    finally:
        await close_postgres_stores(stores)
    ids = [{str(run.id) for run in inside}, {str(run.id) for run in claimed}, taken]
    assert [len(found) for found in ids] == [20, 20, 20]
    assert len(set().union(*ids)) == 60
