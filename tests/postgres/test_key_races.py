"""Enqueue keys under real concurrency: two processes' pools racing with one key make one run."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.postgres import PostgresFamily
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.runs import AgentRuns, Enqueued
from tests.contract.kinds import policy, scripted_steps

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PAIRS = 1000
# Pairs in flight at once: every pair's two enqueues start together, and both pools stay busy.
WAVE = 50


def _kinds() -> RunKinds:
    return RunKinds(
        [
            RunKind(policy("chat"), scripted_steps),
            RunKind(policy("ping", key_retention=timedelta(0)), scripted_steps),
        ]
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
async def two_sides(
    postgres_url: str, clock: ManualClock
) -> AsyncIterator[tuple[AgentRuns, AgentRuns]]:
    """Two AgentRuns as two processes would hold them: each its own pool, on one database."""
    families = [PostgresFamily(postgres_url, clock, pool_size=8) for _ in range(2)]
    try:
        left, right = (
            AgentRuns(f.stores, _kinds(), random.Random(n)) for n, f in enumerate(families)
        )
        yield left, right
    finally:
        for family in families:
            await family.close()


_COUNTS = {
    "agent_run": "SELECT count(*) FROM agent_run",
    "agent_run_key": "SELECT count(*) FROM agent_run_key",
}


async def _count(url: str, table: str) -> int:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cursor = await conn.execute(_COUNTS[table])
        row = await cursor.fetchone()
    assert row is not None
    count: int = row[0]
    return count


async def _race(
    left: AgentRuns, right: AgentRuns, kind: str, keys: list[str]
) -> list[tuple[Enqueued, Enqueued]]:
    pairs: list[tuple[Enqueued, Enqueued]] = []
    for start in range(0, len(keys), WAVE):

        async def pair(key: str) -> tuple[Enqueued, Enqueued]:
            one, two = await asyncio.gather(
                left.enqueue_once(kind, workspace="acme", subject=f"s:{key}", key=key),
                right.enqueue_once(kind, workspace="acme", subject=f"s:{key}", key=key),
            )
            return one, two

        pairs += await asyncio.gather(*(pair(key) for key in keys[start : start + WAVE]))
    return pairs


async def test_a_thousand_pairs_of_racing_enqueues_make_a_thousand_runs(
    two_sides: tuple[AgentRuns, AgentRuns], postgres_url: str
) -> None:
    left, right = two_sides
    keys = [f"key-{n}" for n in range(PAIRS)]
    pairs = await _race(left, right, "chat", keys)
    for one, two in pairs:
        assert one.run.id == two.run.id
        assert one.run.key == two.run.key
        # Exactly one side of each pair made the run; the other found it.
        assert sorted([one.created, two.created]) == [False, True]
    assert len({one.run.id for one, _ in pairs}) == PAIRS
    assert await _count(postgres_url, "agent_run") == PAIRS
    assert await _count(postgres_url, "agent_run_key") == PAIRS


async def test_pairs_racing_for_keys_past_their_retention_make_one_new_run_each(
    two_sides: tuple[AgentRuns, AgentRuns], postgres_url: str
) -> None:
    """Both sides find the key's run ended (a kind that keeps no key after the end): one moves
    the key to a new run under the key's lock, the other waits for it and finds that run."""
    left, right = two_sides
    keys = [f"again-{n}" for n in range(200)]
    for key in keys:
        ended = await left.enqueue("ping", workspace="acme", subject=f"s:{key}", key=key)
        await left.cancel(ended.id)
    pairs = await _race(left, right, "ping", keys)
    for one, two in pairs:
        assert one.run.id == two.run.id
        assert sorted([one.created, two.created]) == [False, True]
    assert await _count(postgres_url, "agent_run") == 2 * len(keys)
    assert await _count(postgres_url, "agent_run_key") == len(keys)


async def test_enqueues_racing_a_purge_of_their_keys_runs_make_one_run_per_key(
    two_sides: tuple[AgentRuns, AgentRuns], postgres_url: str, clock: ManualClock
) -> None:
    """The purge deletes a key with its run unless an enqueue moved the key first; an enqueue
    that finds the key gone after its insert saw it takes it again. Either way: one new run per
    key, and the key names it."""
    left, right = two_sides
    keys = [f"purged-{n}" for n in range(200)]
    old = set()
    for key in keys:
        ended = await left.enqueue("ping", workspace="acme", subject=f"s:{key}", key=key)
        await left.cancel(ended.id)
        old.add(ended.id)
    clock.advance(timedelta(minutes=10))
    purge = asyncio.create_task(left.purge(timedelta(minutes=5), batch=10))
    pairs = await _race(left, right, "ping", keys)
    purged = await purge
    assert purged == len(keys)  # every old run, whichever side of each key it lost to
    for one, two in pairs:
        assert one.run.id == two.run.id
        assert one.run.id not in old
        assert sorted([one.created, two.created]) == [False, True]
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM agent_run_key k JOIN agent_run r ON r.id = k.run_id "
            "WHERE r.state = 'queued'"
        )
        row = await cursor.fetchone()
    assert row is not None
    assert row[0] == len(keys)
    assert await _count(postgres_url, "agent_run_key") == len(keys)
