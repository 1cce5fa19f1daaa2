"""Provider limits under real concurrency: takes from several pools at once never over-grant."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.postgres import PostgresFamily
from agentruns.app.kinds import RunKinds
from agentruns.app.runs import AgentRuns
from agentruns.domain.errors import LimitExhausted
from agentruns.domain.provider_limits import ProviderLimit

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
# Bursts of 50 requests and 5,000 tokens, on a clock that stands still: exactly that much.
LIMIT = ProviderLimit("shared", requests=3_000, tokens=300_000)


@pytest.fixture
async def three_sides(postgres_url: str) -> AsyncIterator[list[AgentRuns]]:
    """Three AgentRuns as three processes would hold them: each its own pool, one database."""
    clock = ManualClock(START)
    families = [PostgresFamily(postgres_url, clock, pool_size=6) for _ in range(3)]
    try:
        yield [AgentRuns(f.stores, RunKinds([]), random.Random(n)) for n, f in enumerate(families)]
    finally:
        for family in families:
            await family.close()


async def _granted(runs: AgentRuns, tokens: int) -> int:
    try:
        await runs.take(LIMIT.name, tokens=tokens, wait=timedelta(0))
    except LimitExhausted:
        return 0
    return 1


async def test_concurrent_takes_from_several_pools_grant_the_burst_and_no_more(
    three_sides: list[AgentRuns],
) -> None:
    await three_sides[0].declare_limit(LIMIT)
    await asyncio.gather(*(side.declare_limit(LIMIT) for side in three_sides))  # no refill
    takes = [three_sides[n % 3] for n in range(150)]
    granted = await asyncio.gather(*(_granted(side, 0) for side in takes))
    assert sum(granted) == 50
    # Tokens: 60 takes of 100 from a bucket of 5,000 (requests are spent: ask for none).
    await three_sides[1].declare_limit(ProviderLimit("shared", tokens=300_000))
    tokens = await asyncio.gather(*(_token_take(three_sides[n % 3]) for n in range(60)))
    assert sum(tokens) == 50


async def _token_take(runs: AgentRuns) -> int:
    try:
        await runs.take(LIMIT.name, requests=0, tokens=100, wait=timedelta(0))
    except LimitExhausted:
        return 0
    return 1
