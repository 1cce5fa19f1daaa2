"""A kind's step timeout on every backend: a step that hangs is cancelled and retried."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.recorded import RecordedSteps, StepContext
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.failures import FailureClass
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome, TerminationReason
from tests.contract.conftest import Backend
from tests.contract.kinds import BACKOFF, policy
from tests.contract.test_worker import within

TIMEOUT = timedelta(milliseconds=50)


class Hangs:
    """Steps that hang under epoch 1 until cancelled, noting that they saw the cancel."""

    def __init__(self) -> None:
        self.cancelled: list[int] = []
        self.ran: list[tuple[int, str]] = []

    async def hang(self, run: AgentRun) -> None:
        if run.epoch == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(run.epoch)
                raise

    async def plain(self, run: AgentRun) -> AsyncIterator[StepEvent]:
        yield StepEvent("step", {"index": 0})
        await self.hang(run)
        yield StepEvent("step", {"index": 1})

    async def note(self, run: AgentRun, name: str) -> str:
        self.ran.append((run.epoch, name))
        if name == "act":
            await self.hang(run)
        return name

    async def recorded(self, run: AgentRun, ctx: StepContext) -> None:
        await ctx.step("plan", self.note, run, "plan")
        await ctx.step("act", self.note, run, "act")


@pytest.fixture
def hangs(kinds: RunKinds) -> Hangs:
    hangs = Hangs()
    kinds.register(RunKind(policy("hangs", step_timeout=TIMEOUT), hangs.plain))
    kinds.register(
        RunKind(policy("hangs-rec", step_timeout=TIMEOUT), RecordedSteps(hangs.recorded))
    )
    return hangs


@pytest.mark.parametrize(
    ("kind", "named"), [("hangs", "step 2"), ("hangs-rec", "step 'act'")], ids=["plain", "recorded"]
)
async def test_a_step_past_its_timeout_is_cancelled_and_retried(
    runs: AgentRuns, worker: Worker, backend: Backend, hangs: Hangs, kind: str, named: str
) -> None:
    """The hanging step sees CancelledError; the attempt is a retryable timeout with its own
    failure record, and the retry runs (a recorded kind replays what it recorded)."""
    run = await runs.enqueue(kind, workspace="acme", subject="s")
    [first] = await runs.claim(worker.holder)
    assert await within(worker.drive(first)) is RunOutcome.REQUEUED
    assert hangs.cancelled == [1]

    requeued = await runs.get(run.id)
    assert (requeued.state, requeued.attempt) == (AgentRunState.QUEUED, 1)
    [failure] = await runs.failures(run.id)
    assert failure.error_type == "agentruns.StepTimedOut"
    assert failure.failure_class is FailureClass.TIMEOUT
    assert f"{named} ran past the step timeout of 0:00:00.050000" in failure.message

    backend.clock.advance(BACKOFF.base)
    [again] = await runs.claim(worker.holder)
    assert await within(worker.drive(again)) is RunOutcome.COMPLETED
    assert (await runs.get(run.id)).end_reason is TerminationReason.COMPLETED
    if kind == "hangs-rec":
        assert hangs.ran == [(1, "plan"), (1, "act"), (2, "act")]


async def test_a_step_that_swallows_the_cancel_still_times_out(
    runs: AgentRuns, worker: Worker, kinds: RunKinds
) -> None:
    """A step that catches the cancel and returns anyway is failed all the same: its event is
    not written."""

    async def steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        yield StepEvent("late")

    kinds.register(RunKind(policy("stubborn", step_timeout=TIMEOUT), steps))
    run = await runs.enqueue("stubborn", workspace="acme", subject="s")
    [leased] = await runs.claim(worker.holder)
    assert await within(worker.drive(leased)) is RunOutcome.REQUEUED
    assert await runs.events(run.id) == []
    [failure] = await runs.failures(run.id)
    assert failure.error_type == "agentruns.StepTimedOut"


async def test_a_step_that_raises_its_own_timeout_error_is_not_renamed(
    runs: AgentRuns, worker: Worker, kinds: RunKinds
) -> None:
    """Only the worker's own bound becomes StepTimedOut."""

    async def steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        raise TimeoutError("the provider timed out")
        yield StepEvent("never")

    kinds.register(RunKind(policy("own", step_timeout=timedelta(seconds=30)), steps))
    run = await runs.enqueue("own", workspace="acme", subject="s")
    [leased] = await runs.claim(worker.holder)
    assert await within(worker.drive(leased)) is RunOutcome.REQUEUED
    [failure] = await runs.failures(run.id)
    assert (failure.error_type, failure.failure_class) == ("TimeoutError", FailureClass.TIMEOUT)
