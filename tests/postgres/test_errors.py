"""Driver errors never leave the adapter untranslated: each becomes an agentruns error."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from uuid import uuid4

import psycopg
import pytest
from sqlalchemy import text

from agentruns.adapters.postgres import (
    close_postgres_stores,
    make_postgres_stores,
)
from agentruns.adapters.postgres.database import execute
from agentruns.app.ports import ClaimRequest, NewRun
from agentruns.domain.bands import Band
from agentruns.domain.errors import IllegalTransition, InvalidRequest, StoreUnavailable
from examples.review import PostgresReviewJobs, ReviewJob, ReviewStatus


def _new_run(subject: str = "s") -> NewRun:
    return NewRun(
        id=uuid4(),
        kind="chat",
        workspace="acme",
        subject=subject,
        band=Band.BATCH,
        payload={},
        lease=timedelta(seconds=30),
    )


async def test_an_unreachable_server_is_store_unavailable() -> None:
    stores = make_postgres_stores("postgresql://nobody@/nowhere?host=/nonexistent-socket-dir")
    try:
        with pytest.raises(StoreUnavailable) as raised:
            async with stores.scope.transaction() as tx:
                await stores.runs.now(tx)
        assert raised.value.__cause__ is not None
    finally:
        await close_postgres_stores(stores)


async def test_a_run_id_taken_twice_is_an_illegal_transition(postgres_url: str) -> None:
    stores = make_postgres_stores(postgres_url)
    new = _new_run()
    try:
        async with stores.scope.transaction() as tx:
            await stores.runs.insert(tx, new)
        with pytest.raises(IllegalTransition) as raised:
            async with stores.scope.transaction() as tx:
                await stores.runs.insert(tx, new)
        assert isinstance(raised.value.__cause__, Exception)
    finally:
        await close_postgres_stores(stores)


async def test_a_second_leased_run_of_a_subject_is_an_illegal_transition(
    postgres_url: str,
) -> None:
    stores = make_postgres_stores(postgres_url)
    try:
        async with stores.scope.transaction() as tx:
            await stores.runs.insert(tx, _new_run())
            second = await stores.runs.insert(tx, _new_run())
            await stores.runs.claim(tx, ClaimRequest(holder="w"))
        with pytest.raises(IllegalTransition, match="a leased run is its subject's head"):
            async with stores.scope.transaction() as tx:
                await execute(
                    tx,
                    text(
                        "UPDATE agent_run SET state = 'leased', epoch = 1, holder = 'x', "
                        "leased_until = now() WHERE id = :id"
                    ),
                    {"id": second.id},
                )
    finally:
        await close_postgres_stores(stores)


async def test_a_review_job_that_disagrees_is_refused_at_commit(postgres_url: str) -> None:
    stores = make_postgres_stores(postgres_url)
    jobs = PostgresReviewJobs()

    async def a_running_job_of_a_queued_run() -> None:
        async with stores.scope.transaction() as tx:
            run = await stores.runs.insert(tx, _new_run())
            await jobs.insert(tx, ReviewJob(run.id, "acme", "s", ReviewStatus.RUNNING, 0))

    try:
        with pytest.raises(IllegalTransition, match="review job"):
            await a_running_job_of_a_queued_run()
        async with await psycopg.AsyncConnection.connect(postgres_url) as raw:
            cursor = await raw.execute("SELECT count(*) FROM agent_run")
            assert await cursor.fetchone() == (0,)
    finally:
        await close_postgres_stores(stores)


async def test_a_deadlock_is_a_transaction_conflict(postgres_url: str) -> None:
    """Two transactions that lock two runs in opposite orders: the one PostgreSQL aborts raises
    TransactionConflict, which callers may retry."""
    import asyncio

    from agentruns.domain.errors import TransactionConflict

    stores = make_postgres_stores(postgres_url)
    first, second = _new_run("a"), _new_run("b")
    try:
        async with stores.scope.transaction() as tx:
            await stores.runs.insert(tx, first)
            await stores.runs.insert(tx, second)
        both_hold_one = asyncio.Barrier(2)

        async def lock_in_order(one: NewRun, other: NewRun) -> None:
            async with stores.scope.transaction() as tx:
                await stores.runs.lock(tx, one.id)
                await both_hold_one.wait()
                await stores.runs.lock(tx, other.id)

        results = await asyncio.gather(
            lock_in_order(first, second), lock_in_order(second, first), return_exceptions=True
        )
        conflicts = [r for r in results if isinstance(r, TransactionConflict)]
        assert len(conflicts) == 1
        assert [r for r in results if r is not None and r not in conflicts] == []
    finally:
        await close_postgres_stores(stores)


@pytest.mark.parametrize(
    "new",
    [
        replace(_new_run(), subject="pr\x00:1"),
        replace(_new_run(), workspace="acme\ud800"),
        replace(_new_run(), payload={"x": "\x00"}),
        replace(_new_run(), payload={"x": 10**5000}),
        replace(
            _new_run(), due_at=datetime(9999, 12, 31, 23, tzinfo=timezone(-timedelta(hours=5)))
        ),
    ],
    ids=["nul-text", "lone-surrogate", "nul-in-jsonb", "5000-digits", "year-10000"],
)
async def test_a_value_postgres_cannot_take_is_an_invalid_request(
    postgres_url: str, new: NewRun
) -> None:
    """Below the use cases' own checks, a driver DataError (or the driver refusing to encode a
    value) is the request's fault, not an outage: InvalidRequest, never StoreUnavailable, and the
    transaction writes nothing."""
    stores = make_postgres_stores(postgres_url)
    try:
        with pytest.raises(InvalidRequest) as raised:
            async with stores.scope.transaction() as tx:
                await stores.runs.insert(tx, new)
        assert not isinstance(raised.value, StoreUnavailable)
        async with stores.scope.transaction() as tx:
            assert await stores.runs.get(tx, new.id) is None
    finally:
        await close_postgres_stores(stores)
