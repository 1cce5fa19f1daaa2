"""AgentRuns and the reaper under random steps: the run invariants hold after every one.

The machine drives the use cases only (never a store's insides), so another backend can run it
by swapping :func:`memory_backend`. Runs of the recorded kind ``agent`` (ADRs/0022) are also
driven by a worker, whole or cut short, by their holder or by a stale one: a recorded step's
function never runs again once its record is in, and a replayed step returns what was recorded.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, TypeVar
from uuid import UUID

from hypothesis import HealthCheck, event, settings, strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.memory import MemoryFamily
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.ports import Notifier, Stores
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.recorded import RecordedSteps, StepContext
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.bands import Band
from agentruns.domain.errors import (
    IllegalTransition,
    LeaseLost,
    RetryBudgetExhausted,
    StoreUnavailable,
)
from agentruns.domain.failures import ProviderError
from agentruns.domain.recorded_steps import RECORDED_STEP
from agentruns.domain.run import AgentRun, AgentRunFence
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome, TerminationReason
from examples.review import review_jobs
from tests.contract.conftest import START
from tests.contract.kinds import LEASE, contract_kinds, policy
from tests.strategies import (
    bands,
    clock_steps,
    contended_subjects,
    holder_end_reasons,
    holders,
    short_delays,
    workspaces,
)

T = TypeVar("T")

kind_names = st.sampled_from(["chat", "sweep", "review", "agent"])
new_runs = st.tuples(kind_names, workspaces, contended_subjects, bands)


# The recorded kind's steps in the order its code asks for them: (name, occurrence).
AGENT_STEPS = (("plan", 1), ("act", 1), ("act", 2), ("report", 1))
# How an attempt of the recorded kind goes: through; cut short once the function of a step ran
# (its holder gone, nothing recorded, the run left leased); or paused in that function (a holder
# that stalls, perhaps past its lease, and later goes on to write its record).
attempt_stops = st.sampled_from([None, "cut", "pause"])
step_indexes = st.integers(min_value=0, max_value=len(AGENT_STEPS) - 1)

Execution = tuple[UUID, str, int, int]  # (run, step name, occurrence, epoch)
Records = list[tuple[str, object, int]]  # a run's step.recorded events: (type, data, epoch)


class Script:
    """How one attempt (a run at an epoch) goes."""

    def __init__(self, stop: str | None, at: int, fail: bool) -> None:
        self.stop, self.at, self.fail = stop, at, fail
        self.reached = asyncio.Event()  # the attempt paused
        self.gate = asyncio.Event()  # the paused attempt may go on


class RecordedAgent:
    """The recorded kind ``agent`` on one backend: plan, act twice, report, and a 503 before
    the report when the attempt's script says so. Every execution of a step's function is
    counted, and every result a step call returned to the code kept."""

    def __init__(self) -> None:
        self.executions: list[Execution] = []
        self.returned: list[tuple[UUID, str, int, object]] = []
        self.scripts: dict[tuple[UUID, int], Script] = {}
        self.replayed = 0

    async def steps(self, run: AgentRun, ctx: StepContext) -> None:
        script = self.scripts[run.id, run.epoch]
        for index, (name, occurrence) in enumerate(AGENT_STEPS):
            if name == "report" and script.fail:
                raise ProviderError("the model is overloaded", status=503)
            self.replayed += ctx.replaying
            result = await ctx.step(name, self.call, run, script, name, occurrence, index)
            self.returned.append((run.id, name, occurrence, result))

    async def call(
        self, run: AgentRun, script: Script, name: str, occurrence: int, index: int
    ) -> object:
        self.executions.append((run.id, name, occurrence, run.epoch))
        if index == script.at and script.stop == "cut":
            raise StoreUnavailable("the holder is gone")
        if index == script.at and script.stop == "pause":
            script.reached.set()
            await script.gate.wait()
        return {"step": f"{name} #{occurrence}", "by": run.epoch}


class Side:
    """One backend as the recorded kind's worker sees it."""

    def __init__(self, runs: AgentRuns, kinds: RunKinds, notifier: Notifier) -> None:
        self.runs = runs
        self.kinds = kinds
        self.notifier = notifier
        self.agent = RecordedAgent()
        kinds.register(RunKind(policy("agent"), RecordedSteps(self.agent.steps)))

    def start(
        self, loop: asyncio.AbstractEventLoop, run: AgentRun, script: Script
    ) -> asyncio.Task[RunOutcome]:
        """A worker's attempt at ``run`` as claimed, as a task on ``loop``."""
        self.agent.scripts[run.id, run.epoch] = script
        assert run.holder is not None
        worker = Worker(
            self.runs,
            self.kinds,
            self.notifier,
            random.Random(0),
            holder=run.holder,
            group_commit=False,
        )
        return loop.create_task(worker.drive(run))

    async def records(self, run_id: UUID) -> Records:
        return [
            (event.type, event.data, event.epoch)
            for event in await self.runs.events(run_id)
            if event.type == RECORDED_STEP
        ]

    async def check(self, run_id: UUID) -> Records:
        """The recorded-steps invariants of one run; returns its records."""
        records = await self.records(run_id)
        steps = [(data["name"], data["occurrence"]) for _, data, _ in records]  # type: ignore[call-overload]
        # Recorded in the code's order, each once.
        assert tuple(steps) == AGENT_STEPS[: len(steps)], steps
        recorded = {
            (data["name"], data["occurrence"]): (epoch, data["result"])  # type: ignore[call-overload]
            for _, data, epoch in records
        }
        executions = [e for e in self.agent.executions if e[0] == run_id]
        # A step's function runs at most once per attempt.
        assert len(executions) == len(set(executions)), executions
        for _, name, occurrence, epoch in executions:
            if (name, occurrence) in recorded:
                # Never again once recorded: a later epoch was leased after the record was in.
                assert epoch <= recorded[name, occurrence][0], (name, occurrence, epoch, records)
        for (name, occurrence), (epoch, result) in recorded.items():
            # What is recorded was returned by an execution of its own attempt.
            assert (run_id, name, occurrence, epoch) in executions
            assert result == {"step": f"{name} #{occurrence}", "by": epoch}
        for _, name, occurrence, result in (r for r in self.agent.returned if r[0] == run_id):
            # A step call returns its record: the one it wrote, or the one it replayed.
            assert recorded[name, occurrence][1] == result
        return records


async def until_paused(task: asyncio.Task[RunOutcome], script: Script) -> bool:
    """Run the attempt until it pauses (True) or ends (False)."""
    reached = asyncio.ensure_future(script.reached.wait())
    await asyncio.wait({task, reached}, return_when=asyncio.FIRST_COMPLETED)
    reached.cancel()
    return not task.done()


def memory_backend(clock: ManualClock) -> tuple[Stores, RunKinds]:
    """The same construction as the contract suite's memory backend."""
    family = MemoryFamily(clock)
    return family.stores, contract_kinds(review_jobs(family))


class AgentRunsMachine(RuleBasedStateMachine):
    """Random enqueue, claim, renew, clock, reap, end, requeue and cancel steps on one backend.

    Fenced writes are checked against what the fence should find (the run as read just before);
    ``fences`` keeps every fence ever handed out, so stale and expired ones are tried too.
    """

    run_ids = Bundle("run_ids")
    fences = Bundle("fences")
    paused = Bundle("paused")  # paused attempts of the recorded kind: (run, their tasks)

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock(START)
        stores, self.kinds = memory_backend(self.clock)
        rng = random.Random(0)
        self.runs = AgentRuns(stores, self.kinds, rng)
        self.reaper = AgentRunReaper(stores, self.kinds, rng)
        # The backends a recorded kind's attempt runs on (the side-by-side machine adds one).
        self.sides = [Side(self.runs, self.kinds, stores.notifier)]
        self.waiting: list[list[asyncio.Task[RunOutcome]]] = []
        self.known: list[UUID] = []
        self.epochs: dict[UUID, int] = {}
        self.identities: dict[UUID, tuple[str, str, str]] = {}
        self.ended: dict[UUID, AgentRun] = {}

    def teardown(self) -> None:
        self.stop_paused()
        self.loop.close()

    def stop_paused(self) -> None:
        """Cancel the attempts still paused when the machine stops."""
        for tasks in self.waiting:
            for task in tasks:
                task.cancel()
            self.run(asyncio.gather(*tasks, return_exceptions=True))
        self.waiting.clear()

    def run(self, step: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(step)

    def holds(self, fence: AgentRunFence) -> bool:
        """Whether the fence holds its run now: LEASED at its epoch and not expired."""
        run = self.run(self.runs.get(fence.run_id))
        return (
            run.state is AgentRunState.LEASED
            and run.epoch == fence.epoch
            and not run.is_expired(self.clock.now())
        )

    def add_run(self, kind: str, workspace: str, subject: str, band: Band) -> UUID:
        run = self.run(self.runs.enqueue(kind, workspace=workspace, subject=subject, band=band))
        assert (run.state, run.epoch, run.attempt) == (AgentRunState.QUEUED, 0, 0)
        self.known.append(run.id)
        return run.id

    @initialize(target=run_ids, specs=st.lists(new_runs, min_size=1, max_size=6))
    def some_runs(self, specs: list[tuple[str, str, str, Band]]) -> MultipleResults[UUID]:
        return multiple(*(self.add_run(*spec) for spec in specs))

    @rule(target=run_ids, spec=new_runs)
    def enqueue(self, spec: tuple[str, str, str, Band]) -> UUID:
        return self.add_run(*spec)

    @rule(target=fences, holder=holders, limit=st.integers(min_value=1, max_value=4))
    def claim(self, holder: str, limit: int) -> MultipleResults[AgentRunFence]:
        before = {run_id: self.run(self.runs.get(run_id)) for run_id in self.known}
        claimed = self.run(self.runs.claim(holder, limit=limit))
        assert len(claimed) <= limit
        assert len({(run.workspace, run.subject) for run in claimed}) == len(claimed)
        for run in claimed:
            assert before[run.id].state is AgentRunState.QUEUED
            assert run.epoch == before[run.id].epoch + 1
            assert (run.state, run.holder) == (AgentRunState.LEASED, holder)
        return multiple(*(run.fence for run in claimed))

    @rule(target=fences, holder=holders, workspace=workspaces, subject=contended_subjects)
    def claim_subject(
        self, holder: str, workspace: str, subject: str
    ) -> MultipleResults[AgentRunFence]:
        run = self.run(
            self.runs.claim_subject(holder, workspace, subject, kinds=["chat", "review"])
        )
        if run is None:
            return multiple()
        assert (run.workspace, run.subject, run.state) == (
            workspace,
            subject,
            AgentRunState.LEASED,
        )
        assert run.kind in {"chat", "review"}
        return multiple(run.fence)

    @rule(target=fences, holder=holders)
    def a_claimer_crashes(self, holder: str) -> MultipleResults[AgentRunFence]:
        """A claimer takes a run and dies; past its lease the reaper takes the run back."""
        fences = self.claim(holder, 1)
        self.advance_clock(LEASE, then_reap=True)
        return fences

    @rule(
        target=paused,
        holder=holders,
        attempts=st.lists(
            st.tuples(attempt_stops, step_indexes, st.booleans()), min_size=1, max_size=3
        ),
    )
    def agent_attempts(
        self, holder: str, attempts: list[tuple[str | None, int, bool]]
    ) -> MultipleResults[tuple[AgentRun, list[asyncio.Task[RunOutcome]]]]:
        """A worker claims a run of the recorded kind and drives it: through (it completes, or
        fails with a 503 before its report and is requeued), cut short, or paused in a step's
        function. Then, for each further attempt, the lease and the backoff run out and the
        reaper ticks before the next claim (mostly the same run again, resumed)."""
        for number, (stop, at, fail) in enumerate(attempts):
            if number:
                self.advance_clock(LEASE, then_reap=True)
            claimed = self.run(self.runs.claim(holder, kinds=["agent"]))
            if not claimed:
                continue
            [run] = claimed
            if run.epoch > 1:
                event("a recorded run was claimed again")
            before = self.run(self.sides[0].records(run.id))
            # Started here, run below: the tasks run whenever the loop does.
            tasks = [side.start(self.loop, run, Script(stop, at, fail)) for side in self.sides]
            if stop == "pause":
                # Not paused when the step is replayed (its function does not run) or not reached.
                stalled = [
                    self.run(until_paused(task, side.agent.scripts[run.id, run.epoch]))
                    for side, task in zip(self.sides, tasks, strict=True)
                ]
                assert len(set(stalled)) == 1, stalled
                if stalled[0]:
                    self.waiting.append(tasks)
                    return multiple((run, tasks))
            self.settle(run, tasks, before, held=True)
        return multiple()

    @rule(attempt=consumes(paused), late=st.booleans())
    def a_paused_attempt_goes_on(
        self, attempt: tuple[AgentRun, list[asyncio.Task[RunOutcome]]], late: bool
    ) -> None:
        """The paused holder wakes and writes its record: refused if it lost the run meanwhile
        (``late``: it stalled past its lease, and the reaper took the run back)."""
        run, tasks = attempt
        if late:
            self.advance_clock(LEASE, then_reap=True)
        before = self.run(self.sides[0].records(run.id))
        held = self.holds(run.fence)
        if not held:
            event("a stale holder of a recorded run woke")
        for side in self.sides:
            side.agent.scripts[run.id, run.epoch].gate.set()
        self.waiting.remove(tasks)
        self.settle(run, tasks, before, held)

    def settle(
        self, run: AgentRun, tasks: list[asyncio.Task[RunOutcome]], before: Records, held: bool
    ) -> None:
        """Each backend's attempt to its outcome: the same outcome, executions and records on
        every backend, and the recorded-steps invariants on each. ``held``: whether the holder
        held the run as the attempt went on (with the records ``before`` it)."""
        answers = []
        for side, task in zip(self.sides, tasks, strict=True):
            outcome = self.run(task)
            records = self.run(side.check(run.id))
            answers.append((outcome, records, side.agent.executions, side.agent.returned))
        assert all(answer == answers[0] for answer in answers), answers
        outcome, records, _, _ = answers[0]
        if not held:
            # A holder that had lost the run records nothing.
            assert outcome in {RunOutcome.LEASE_LOST, RunOutcome.CANCELLED}, outcome
            assert records == before
        if self.sides[0].agent.replayed:
            event("a recorded step was replayed")

    @rule(fence=fences)
    def renew(self, fence: AgentRunFence) -> None:
        expected = self.holds(fence)
        try:
            renewed = self.run(self.runs.renew(fence))
        except LeaseLost:
            assert not expected
            event("a stale fence was refused")
        else:
            assert expected
            assert renewed.leased_until == self.clock.now() + renewed.lease

    @rule(delta=clock_steps, then_reap=st.booleans())
    def advance_clock(self, delta: timedelta, then_reap: bool) -> None:
        """Time passes; the reaper, which ticks on every replica, often runs right after."""
        self.clock.advance(delta)
        if then_reap:
            self.reap()

    @rule()
    def reap(self) -> None:
        report = self.run(self.reaper.tick())
        assert report.failed == 0
        assert report.taken_back == report.requeued + report.ended
        if report.taken_back:
            event("the reaper took a lease back")
        if report.overdue_ended:
            event("the reaper ended an overdue run")

    @rule(fence=fences, reason=holder_end_reasons)
    def end(self, fence: AgentRunFence, reason: TerminationReason) -> None:
        expected = self.holds(fence)
        try:
            ended = self.run(self.runs.end(fence, reason))
        except LeaseLost:
            assert not expected
        else:
            assert expected
            assert (ended.state, ended.end_reason) == (AgentRunState.ENDED, reason)

    @rule(fence=fences, charged=st.booleans(), delay=short_delays)
    def requeue(self, fence: AgentRunFence, charged: bool, delay: timedelta) -> None:
        expected = self.holds(fence)
        before = self.run(self.runs.get(fence.run_id))
        budget = self.kinds.get(before.kind).policy.retry_budget
        try:
            after = self.run(self.runs.requeue(fence, charged=charged, delay=delay))
        except LeaseLost:
            assert not expected
        except RetryBudgetExhausted:
            assert expected
            assert charged
            assert before.attempt == budget
            event("a charged requeue was refused at the budget")
            assert self.run(self.runs.get(fence.run_id)) == before
        else:
            assert expected
            assert after.state is AgentRunState.QUEUED
            assert after.attempt == before.attempt + (1 if charged else 0)
            assert after.due_at == self.clock.now() + delay

    @rule(run_id=run_ids)
    def cancel(self, run_id: UUID) -> None:
        before = self.run(self.runs.get(run_id))
        try:
            after = self.run(self.runs.cancel(run_id))
        except IllegalTransition:
            assert before.state is AgentRunState.ENDED
        else:
            assert before.state is not AgentRunState.ENDED
            assert (after.state, after.end_reason) == (
                AgentRunState.ENDED,
                TerminationReason.CANCELLED,
            )

    def everything(self) -> list[AgentRun]:
        return [self.run(self.runs.get(run_id)) for run_id in self.known]

    @invariant()
    def every_run_holds_the_run_invariants(self) -> None:
        """Every run read once after each step, then each invariant checked over what was read."""
        everything = self.everything()
        self.at_most_one_leased_run_per_subject(everything)
        self.epochs_only_grow(everything)
        self.a_runs_identity_never_changes(everything)
        self.attempts_never_exceed_the_budget(everything)
        self.an_ended_run_never_changes(everything)
        self.every_run_is_queued_leased_or_ended_with_a_reason(everything)

    def at_most_one_leased_run_per_subject(self, everything: list[AgentRun]) -> None:
        leased = [
            (run.workspace, run.subject) for run in everything if run.state is AgentRunState.LEASED
        ]
        assert len(leased) == len(set(leased)), leased

    def epochs_only_grow(self, everything: list[AgentRun]) -> None:
        for run in everything:
            assert run.epoch >= self.epochs.get(run.id, 0)
            self.epochs[run.id] = run.epoch

    def a_runs_identity_never_changes(self, everything: list[AgentRun]) -> None:
        for run in everything:
            identity = (run.kind, run.workspace, run.subject)
            assert self.identities.setdefault(run.id, identity) == identity

    def attempts_never_exceed_the_budget(self, everything: list[AgentRun]) -> None:
        for run in everything:
            assert 0 <= run.attempt <= self.kinds.get(run.kind).policy.retry_budget

    def an_ended_run_never_changes(self, everything: list[AgentRun]) -> None:
        for run in everything:
            if run.id in self.ended:
                assert run == self.ended[run.id]
                assert run.payload == self.ended[run.id].payload
            elif run.state is AgentRunState.ENDED:
                self.ended[run.id] = run

    def every_run_is_queued_leased_or_ended_with_a_reason(self, everything: list[AgentRun]) -> None:
        for run in everything:
            if run.end_reason is TerminationReason.RETRIES_EXHAUSTED:
                event("a run ended with its retries exhausted")
            match run.state:
                case AgentRunState.QUEUED:
                    assert run.due_at is not None
                    assert (run.leased_until, run.holder, run.end_reason) == (None, None, None)
                case AgentRunState.LEASED:
                    assert run.leased_until is not None
                    assert run.holder is not None
                    assert run.epoch >= 1
                    assert run.end_reason is None
                case AgentRunState.ENDED:
                    assert run.end_reason is not None
                    assert run.ended_at is not None
                    assert run.leased_until is None


AgentRunsMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAgentRunsInvariants = AgentRunsMachine.TestCase
