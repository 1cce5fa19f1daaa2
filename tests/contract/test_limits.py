"""Provider limits on every backend (ADRs/0032): the memory store applies the domain's bucket
rule, the PostgreSQL store restates it in SQL, and these tests hold the two together."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.recorded import RecordedSteps, StepContext
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.errors import InvalidRequest, LimitExhausted, UnknownLimit
from agentruns.domain.failures import FailureClass
from agentruns.domain.provider_limits import ProviderLimit
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from tests.contract.conftest import Backend
from tests.contract.kinds import policy

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
    assert refused.value.retry_in == pytest.approx(61 / 590, rel=1e-3)
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
    backend.clock.advance(timedelta(seconds=600 / (59_000 / 61) + 0.01))
    assert await _granted(runs, GPT.name, tokens=3_000)
    # Below zero now (-2,000): the next token waits until the bucket is back above it.
    assert not await _granted(runs, GPT.name, tokens=1)
    assert await runs.empty_limits([GPT.name, "unknown"]) == {
        GPT.name: pytest.approx(
            timedelta(seconds=2_001 / (59_000 / 61)), abs=timedelta(milliseconds=1)
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
        await runs.pause_limit("never-declared", datetime(2030, 1, 1, tzinfo=UTC))
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


class _Response:
    def __init__(self, retry_after: str) -> None:
        self.status_code = 429
        self.headers = {"retry-after": retry_after}


class RateLimited(Exception):
    """A model SDK's 429, read by its shape: a status and a response with headers."""

    def __init__(self, retry_after: str) -> None:
        super().__init__("rate limited")
        self.status_code = 429
        self.response = _Response(retry_after)


def _limited_kinds(runs_box: list[AgentRuns]) -> RunKinds:
    async def steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        await runs_box[0].take(GPT.name, tokens=int(run.payload.get("tokens", 0)), wait=NONE)  # type: ignore[arg-type]
        yield StepEvent("called", {})
        retry_after = run.payload.get("retry_after")
        if isinstance(retry_after, str):
            raise RateLimited(retry_after)

    async def plain(run: AgentRun) -> AsyncIterator[StepEvent]:
        yield StepEvent("step", {})

    return RunKinds(
        [
            RunKind(policy("limited", limits=(GPT.name,)), steps),
            RunKind(policy("plain"), plain),
        ]
    )


async def _limited(backend: Backend, rng: random.Random) -> tuple[AgentRuns, Worker, Worker]:
    box: list[AgentRuns] = []
    kinds = _limited_kinds(box)
    runs = AgentRuns(backend.stores, kinds, rng)
    box.append(runs)
    await runs.declare_limit(GPT)
    one = Worker(runs, kinds, backend.stores.notifier, rng, holder="w-1", poll_interval=0.05)
    two = Worker(runs, kinds, backend.stores.notifier, rng, holder="w-2", poll_interval=0.05)
    return runs, one, two


async def test_a_worker_claims_no_run_whose_limit_is_empty_until_the_clock_refills_it(
    backend: Backend, rng: random.Random
) -> None:
    runs, worker, _ = await _limited(backend, rng)
    for _ in range(10):
        await runs.take(GPT.name, wait=NONE)  # another process emptied the requests bucket
    queued = await runs.enqueue("limited", workspace="acme", subject="a")
    await runs.enqueue("plain", workspace="acme", subject="b")
    # The plain kind is still claimed; the limited one waits, and spends no attempt.
    assert await worker.claim_and_drive(8) == 1
    waiting = await runs.get(queued.id)
    assert waiting.state is AgentRunState.QUEUED
    assert (waiting.epoch, waiting.attempt) == (0, 0)
    backend.clock.advance(timedelta(seconds=0.2))
    assert await worker.claim_and_drive(8) == 1
    done = await runs.get(queued.id)
    assert done.end_reason is TerminationReason.COMPLETED


@pytest.mark.parametrize("form", ["seconds", "http-date"])
async def test_a_429_with_retry_after_pauses_the_limit_for_every_worker_and_delays_the_run(
    backend: Backend, rng: random.Random, form: str
) -> None:
    runs, one, two = await _limited(backend, rng)
    now = backend.clock.now()
    retry_after = (
        "45" if form == "seconds" else format_datetime(now + timedelta(seconds=45), usegmt=True)
    )
    failing = await runs.enqueue(
        "limited", workspace="acme", subject="a", payload={"retry_after": retry_after}
    )
    other = await runs.enqueue("limited", workspace="acme", subject="b")
    assert await one.claim_and_drive(1) == 1
    requeued = await runs.get(failing.id)
    assert requeued.state is AgentRunState.QUEUED
    assert requeued.due_at >= now + timedelta(seconds=45)
    [record] = await runs.failures(failing.id)
    assert record.failure_class is FailureClass.RATE_LIMITED
    assert record.retry_after == pytest.approx(45, abs=0.01)
    # Paused for everyone: the other worker claims nothing and a take is refused.
    assert await two.claim_and_drive(8) == 0
    assert (await runs.get(other.id)).epoch == 0
    with pytest.raises(LimitExhausted) as refused:
        await runs.take(GPT.name, wait=NONE)
    assert refused.value.retry_in == pytest.approx(45, abs=1)
    backend.clock.advance(timedelta(seconds=44))
    assert await two.claim_and_drive(8) == 0
    backend.clock.advance(timedelta(seconds=1.5))
    # Both are due now (the failing one at its Retry-After, and it fails again).
    assert await two.claim_and_drive(8) == 2
    assert (await runs.get(other.id)).end_reason is TerminationReason.COMPLETED


async def test_a_recorded_step_takes_from_a_limit_before_its_call(
    backend: Backend, rng: random.Random
) -> None:
    async def chat(run: AgentRun, ctx: StepContext) -> None:
        await ctx.take(GPT.name, tokens=700)
        await ctx.step("call", _answer)

    kinds = RunKinds([RunKind(policy("recorded", limits=(GPT.name,)), RecordedSteps(chat))])
    runs = AgentRuns(backend.stores, kinds, rng)
    await runs.declare_limit(GPT)
    worker = Worker(runs, kinds, backend.stores.notifier, rng, holder="w-1", poll_interval=0.05)
    run = await runs.enqueue("recorded", workspace="acme", subject="a")
    assert await worker.claim_and_drive(1) == 1
    assert (await runs.get(run.id)).end_reason is TerminationReason.COMPLETED
    # 300 of the burst's 1,000 tokens are left.
    assert not await _granted(runs, GPT.name, tokens=301)
    assert await _granted(runs, GPT.name, tokens=300)


async def _answer() -> str:
    return "ok"
