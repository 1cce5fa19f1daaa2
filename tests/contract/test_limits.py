"""Provider limits on every backend (ADRs/0032): the memory store applies the domain's bucket
rule, the PostgreSQL store restates it in SQL, and these tests hold the two together."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentruns.app.runs import AgentRuns
from agentruns.domain.errors import InvalidRequest, LimitExhausted, UnknownLimit
from agentruns.domain.provider_limits import ProviderLimit
from tests.contract.conftest import Backend

NONE = timedelta(0)
GPT = ProviderLimit("openai/gpt-5", requests=600, tokens=60_000)  # bursts: 10 and 1,000


async def _granted(runs: AgentRuns, name: str, *, requests: int = 1, tokens: int = 0) -> bool:
    try:
        await runs.take(name, requests=requests, tokens=tokens, wait=NONE)
    except LimitExhausted:
        return False
    return True


async def test_a_take_beyond_the_bucket_is_refused_until_the_clock_refills_it(
    backend: Backend, runs: AgentRuns
) -> None:
    await runs.declare_limit(GPT)
    assert [await _granted(runs, GPT.name) for _ in range(11)] == [True] * 10 + [False]
    with pytest.raises(LimitExhausted) as refused:
        await runs.take(GPT.name, wait=NONE)
    assert refused.value.retry_in == pytest.approx(60 / 590, rel=1e-3)
    backend.clock.advance(timedelta(seconds=0.05))
    assert not await _granted(runs, GPT.name)
    backend.clock.advance(timedelta(seconds=0.06))
    assert await _granted(runs, GPT.name)
    assert not await _granted(runs, GPT.name)


async def test_tokens_are_a_bucket_of_their_own_and_a_large_take_waits_for_a_full_one(
    backend: Backend, runs: AgentRuns
) -> None:
    await runs.declare_limit(GPT)
    assert await _granted(runs, GPT.name, tokens=600)
    # 400 left: a take of 3,000 (more than the burst) waits for a full bucket of 1,000.
    assert not await _granted(runs, GPT.name, tokens=3_000)
    backend.clock.advance(timedelta(seconds=600 / (59_000 / 60) + 0.01))
    assert await _granted(runs, GPT.name, tokens=3_000)
    # Below zero now (-2,000): the next token waits until the bucket is back above it.
    assert not await _granted(runs, GPT.name, tokens=1)
    assert await runs.empty_limits([GPT.name, "unknown"]) == {
        GPT.name: pytest.approx(
            timedelta(seconds=2_001 / (59_000 / 60)), abs=timedelta(milliseconds=1)
        )
    }
    backend.clock.advance(timedelta(seconds=2.1))
    assert await runs.empty_limits([GPT.name]) == {}


async def test_a_paused_limit_refuses_until_its_pause_ends(
    backend: Backend, runs: AgentRuns
) -> None:
    await runs.declare_limit(GPT)
    until = backend.clock.now() + timedelta(seconds=30)
    await runs.pause_limit(GPT.name, until)
    await runs.pause_limit(GPT.name, until - timedelta(seconds=20))  # an earlier end is kept out
    with pytest.raises(LimitExhausted) as refused:
        await runs.take(GPT.name, wait=NONE)
    assert refused.value.retry_in == pytest.approx(30)
    assert set(await runs.empty_limits([GPT.name])) == {GPT.name}
    backend.clock.advance(timedelta(seconds=29))
    assert not await _granted(runs, GPT.name)
    backend.clock.advance(timedelta(seconds=1))
    assert await _granted(runs, GPT.name)


async def test_redeclaring_a_limit_keeps_its_level_within_the_new_burst(
    backend: Backend, runs: AgentRuns
) -> None:
    await runs.declare_limit(GPT)
    for _ in range(8):
        assert await _granted(runs, GPT.name)
    await runs.declare_limit(GPT)  # another process starts: no refill
    assert [await _granted(runs, GPT.name) for _ in range(3)] == [True, True, False]
    smaller = ProviderLimit(GPT.name, requests=120, per=timedelta(minutes=1))
    await runs.declare_limit(smaller)
    assert await runs.limits() == [smaller]
    assert not await _granted(runs, GPT.name)  # still empty: nothing was refilled
    backend.clock.advance(timedelta(seconds=60))
    # Full at the new burst of 2; tokens are no longer limited.
    assert [await _granted(runs, GPT.name, tokens=10**9) for _ in range(3)] == [True, True, False]


async def test_a_take_waits_for_the_refill_within_its_bound(
    backend: Backend, runs: AgentRuns
) -> None:
    await runs.declare_limit(ProviderLimit("slow", requests=2, per=timedelta(seconds=1)))
    assert await _granted(runs, "slow")
    with pytest.raises(LimitExhausted):
        await runs.take("slow", wait=timedelta(milliseconds=30), poll=0.01)


async def test_bad_input_is_a_clear_error_and_writes_nothing(runs: AgentRuns) -> None:
    with pytest.raises(UnknownLimit):
        await runs.take("never-declared", wait=NONE)
    with pytest.raises(UnknownLimit):
        await runs.pause_limit("never-declared", _later())
    await runs.declare_limit(GPT)
    for requests, tokens in [(0, 0), (-1, 0), (1, -5)]:
        with pytest.raises(InvalidRequest):
            await runs.take(GPT.name, requests=requests, tokens=tokens, wait=NONE)
    with pytest.raises(InvalidRequest):
        await runs.declare_limit("openai/gpt-5=500rpm")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        ProviderLimit("zero", requests=0)
    assert await runs.limits() == [GPT]
    # Nothing was taken by the refused takes: the whole burst is still there.
    assert [await _granted(runs, GPT.name) for _ in range(11)] == [True] * 10 + [False]


def _later():  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    return datetime(2030, 1, 1, tzinfo=UTC)
