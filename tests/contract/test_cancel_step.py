"""A cancel reaches the running step on every backend (ADRs/0023): the holder's worker is told
(in process, or by NOTIFY on its one listening connection), its step sees CancelledError, and the
run ends cancelled with the events and recorded steps it had."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from datetime import timedelta

import pytest

from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.recorded import RecordedSteps, StepContext
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.recorded_steps import RECORDED_STEP
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome, TerminationReason
from tests.contract.conftest import Backend
from tests.contract.kinds import policy
from tests.contract.test_worker import BOUND, within

# A cancel on an idle worker reaches the step in milliseconds; the bound is generous for a
# loaded machine and still well under the heartbeat's fallback (a third of the 30 s lease).
PROMPT = 2.0


class Calls:
    """A recorded kind: ``plan`` returns at once, ``call`` waits until cancelled (a model call
    that would spend tokens for minutes). With ``stubborn``, the call swallows its first cancel
    and keeps waiting, as a careless cleanup would."""

    def __init__(self, *, stubborn: bool = False) -> None:
        self.stubborn = stubborn
        self.calling = asyncio.Event()
        self.cancelled: list[float] = []  # when each cancel reached the call

    async def plan(self) -> str:
        return "plan"

    async def call(self) -> str:
        self.calling.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(time.perf_counter())
            if not self.stubborn:
                raise
        try:
            await asyncio.sleep(BOUND * 4)  # the swallowed cancel: still busy
        except asyncio.CancelledError:
            self.cancelled.append(time.perf_counter())
            raise
        return "never"

    async def steps(self, run: AgentRun, ctx: StepContext) -> None:
        await ctx.step("plan", self.plan)
        await ctx.step("call", self.call)


def cancelling_worker(
    runs: AgentRuns, kinds: RunKinds, backend: Backend, **options: object
) -> Worker:
    return Worker(
        runs,
        kinds,
        backend.stores.notifier,
        random.Random(5),
        holder="cancel-1",
        poll_interval=0.05,
        **options,  # type: ignore[arg-type]
    )


async def _cancel_mid_call(
    runs: AgentRuns, worker: Worker, calls: Calls, kind: str
) -> tuple[AgentRun, float]:
    """Run the worker's loop, cancel the run once its call runs, wait for its end; the run
    and the time the cancel was asked for."""
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run(stop, grace=BOUND))
    try:
        run = await runs.enqueue(kind, workspace="acme", subject="s")
        await within(calls.calling.wait())
        asked = time.perf_counter()
        await runs.cancel(run.id)
        await within(_outcome(worker, RunOutcome.CANCELLED))
    finally:
        stop.set()
        await within(loop)
    return run, asked


async def _outcome(worker: Worker, outcome: RunOutcome) -> None:
    """Until the worker has ended a run with ``outcome`` (looked at every 5 ms)."""
    for _ in range(int(BOUND / 0.005)):
        if worker.stats.outcomes.get(outcome, 0):
            return
        await asyncio.sleep(0.005)


@pytest.mark.parametrize(
    "step_timeout", [None, timedelta(minutes=5)], ids=["plain", "step-timeout"]
)
async def test_a_cancel_reaches_the_running_step(
    runs: AgentRuns, kinds: RunKinds, backend: Backend, step_timeout: timedelta | None
) -> None:
    """The step waiting on its call sees CancelledError promptly (not at the next boundary, nor
    at a heartbeat a third of a lease away); the run ends cancelled with its recorded step. Under
    a step timeout too: the keeper's cancel is not taken for the timeout's."""
    calls = Calls()
    kinds.register(RunKind(policy("calls", step_timeout=step_timeout), RecordedSteps(calls.steps)))
    worker = cancelling_worker(runs, kinds, backend)
    run, asked = await _cancel_mid_call(runs, worker, calls, "calls")
    [reached] = calls.cancelled
    assert reached - asked < PROMPT
    ended = await runs.get(run.id)
    assert ended.state is AgentRunState.ENDED
    assert ended.end_reason is TerminationReason.CANCELLED
    recorded = [event.data["name"] for event in await runs.events(run.id)]
    assert recorded == ["plan"]
    assert {event.type for event in await runs.events(run.id)} == {RECORDED_STEP}
    assert worker.stats.outcomes == {RunOutcome.CANCELLED: 1}


async def test_a_step_that_swallows_the_cancel_is_cancelled_again_after_the_grace(
    runs: AgentRuns, kinds: RunKinds, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """The call swallows its cancel and goes on: past the worker's cancel grace it is cancelled
    again (one line said), and the run still ends cancelled, nothing more written."""
    stubborn = Calls(stubborn=True)
    kinds.register(RunKind(policy("stubborn"), RecordedSteps(stubborn.steps)))
    worker = cancelling_worker(runs, kinds, backend, cancel_grace=0.05)
    with caplog.at_level(logging.WARNING, logger="agentruns.worker"):
        run, _ = await _cancel_mid_call(runs, worker, stubborn, "stubborn")
    first, again = stubborn.cancelled
    assert again - first >= 0.05
    assert again - first < PROMPT
    said = [r for r in caplog.records if "past the cancel grace" in r.getMessage()]
    assert len(said) == 1
    assert (await runs.get(run.id)).end_reason is TerminationReason.CANCELLED
    assert [event.data["name"] for event in await runs.events(run.id)] == ["plan"]


async def test_a_cancel_of_a_queued_run_tells_no_holder(runs: AgentRuns, backend: Backend) -> None:
    """Only a leased run has a holder to tell: a queued run's cancel notifies nobody."""
    told: list[object] = []
    await backend.stores.notifier.listen()  # PostgreSQL hears what is sent after it listens
    unsubscribe = backend.stores.notifier.on_cancel(told.append)
    try:
        queued = await runs.enqueue("chat", workspace="acme", subject="q")
        await runs.cancel(queued.id)
        leased_run = await runs.enqueue("chat", workspace="acme", subject="l")
        [leased] = await runs.claim("h")
        assert leased.id == leased_run.id
        await runs.cancel(leased.id)
        # In memory the subscribers hear it at the commit; PostgreSQL delivers it on the
        # listening connection, read while someone waits on the notifier.
        async with asyncio.timeout(BOUND):
            while not told:
                await backend.stores.notifier.wait(0.05)
        assert told == [leased.id]
    finally:
        unsubscribe()


async def test_a_cancel_during_the_shutdown_grace_still_reaches_the_step(
    runs: AgentRuns, kinds: RunKinds, backend: Backend
) -> None:
    """A stopping worker no longer claims but still hears cancels while its runs in flight get
    their grace: the cancelled step stops at once, not when the grace runs out."""
    calls = Calls()
    kinds.register(RunKind(policy("calls"), RecordedSteps(calls.steps)))
    worker = cancelling_worker(runs, kinds, backend)
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run(stop, grace=BOUND * 4))
    run = await runs.enqueue("calls", workspace="acme", subject="s")
    await within(calls.calling.wait())
    stop.set()
    await asyncio.sleep(0.05)  # the loop is in its grace now
    asked = time.perf_counter()
    await runs.cancel(run.id)
    await within(loop)
    [reached] = calls.cancelled
    assert reached - asked < PROMPT
    assert worker.stats.outcomes == {RunOutcome.CANCELLED: 1}
