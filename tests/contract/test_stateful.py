"""AgentRuns and the reaper under random steps: the run invariants hold after every one.

The machine drives the use cases only (never a store's insides), so another backend can run it
by swapping :func:`memory_backend`.
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
    initialize,
    invariant,
    multiple,
    rule,
)

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.memory import MemoryFamily
from agentruns.app.kinds import RunKinds
from agentruns.app.ports import Stores
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.domain.bands import Band
from agentruns.domain.errors import IllegalTransition, LeaseLost, RetryBudgetExhausted
from agentruns.domain.run import AgentRun, AgentRunFence
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from examples.review import review_jobs
from tests.contract.conftest import START
from tests.contract.kinds import LEASE, contract_kinds
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

kind_names = st.sampled_from(["chat", "sweep", "review"])
new_runs = st.tuples(kind_names, workspaces, contended_subjects, bands)


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

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock(START)
        stores, self.kinds = memory_backend(self.clock)
        rng = random.Random(0)
        self.runs = AgentRuns(stores, self.kinds, rng)
        self.reaper = AgentRunReaper(stores, self.kinds, rng)
        self.known: list[UUID] = []
        self.epochs: dict[UUID, int] = {}
        self.identities: dict[UUID, tuple[str, str, str]] = {}
        self.ended: dict[UUID, AgentRun] = {}

    def teardown(self) -> None:
        self.loop.close()

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
    def at_most_one_leased_run_per_subject(self) -> None:
        leased = [
            (run.workspace, run.subject)
            for run in self.everything()
            if run.state is AgentRunState.LEASED
        ]
        assert len(leased) == len(set(leased)), leased

    @invariant()
    def epochs_only_grow(self) -> None:
        for run in self.everything():
            assert run.epoch >= self.epochs.get(run.id, 0)
            self.epochs[run.id] = run.epoch

    @invariant()
    def a_runs_identity_never_changes(self) -> None:
        for run in self.everything():
            identity = (run.kind, run.workspace, run.subject)
            assert self.identities.setdefault(run.id, identity) == identity

    @invariant()
    def attempts_never_exceed_the_budget(self) -> None:
        for run in self.everything():
            assert 0 <= run.attempt <= self.kinds.get(run.kind).policy.retry_budget

    @invariant()
    def an_ended_run_never_changes(self) -> None:
        for run in self.everything():
            if run.id in self.ended:
                assert run == self.ended[run.id]
                assert run.payload == self.ended[run.id].payload
            elif run.state is AgentRunState.ENDED:
                self.ended[run.id] = run

    @invariant()
    def every_run_is_queued_leased_or_ended_with_a_reason(self) -> None:
        for run in self.everything():
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
