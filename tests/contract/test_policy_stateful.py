"""Subject policies under random interleavings of enqueue (queue, reject, interrupt, merge),
claim, holder end and cancel, some of them raced against each other (ADRs/0028, 0031).

After every step, against a reference model: at most one leased run per subject; an interrupt
leaves its new run the subject's only active run; a reject either names a run that was active or
finds the subject idle; a merge joins the subject's newest run if it was never claimed, else
queues (with or without a debounce, while time passes, and a run is never claimed before it is
due); and no message is lost: every run an enqueue returned is still there, active or ended
with a reason someone gave it, and every accepted message is an input of the run its enqueue
returned, which no merge joined after its claim. :func:`policy_machine` builds the machine on any
stores; the memory one runs here, the PostgreSQL one in ``tests/postgres``.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, TypeVar
from uuid import UUID

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.memory import MemoryFamily
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.ports import Stores
from agentruns.app.runs import AgentRuns
from agentruns.domain.errors import IllegalTransition, LeaseLost, SubjectBusy
from agentruns.domain.payload import JsonObject
from agentruns.domain.run import AgentRun, AgentRunFence
from agentruns.domain.states import AgentRunState
from agentruns.domain.subject_policy import OnActive, joinable
from agentruns.domain.termination import TerminationReason
from tests.contract.conftest import START
from tests.contract.kinds import policy, scripted_steps

T = TypeVar("T")
SUBJECTS = st.sampled_from(["c:1", "c:2"])
POLICIES = st.sampled_from(list(OnActive))
DEBOUNCES = st.sampled_from([None, timedelta(seconds=5)])
StoresOf = Callable[[ManualClock], tuple[Stores, Callable[[], Coroutine[Any, Any, None]]]]


def memory_stores(clock: ManualClock) -> tuple[Stores, Callable[[], Coroutine[Any, Any, None]]]:
    async def close() -> None:
        return None

    return MemoryFamily(clock).stores, close


class PolicyMachine(RuleBasedStateMachine):
    """Enqueues under each policy, claims, ends and cancels on two subjects of one workspace."""

    fences = Bundle("fences")
    stores_of: StoresOf = staticmethod(memory_stores)

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock(START)
        stores, self._close = self.stores_of(self.clock)
        kinds = RunKinds([RunKind(policy("chat"), scripted_steps)])
        self.runs = AgentRuns(stores, kinds, random.Random(0))
        self.enqueued: list[UUID] = []  # every run an enqueue returned
        self.ended_by: dict[UUID, TerminationReason] = {}
        self.said: dict[int, UUID] = {}  # each accepted message, and the run that took it
        self.read_at_claim: dict[UUID, list[JsonObject]] = {}  # what each claim's kind read
        self.messages = itertools.count()

    def teardown(self) -> None:
        self.run(self._close())
        self.loop.close()

    def run(self, step: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(step)

    def active(self, subject: str) -> list[AgentRun]:
        page = self.run(self.runs.list_runs(workspace="acme", subject=subject, limit=1000))
        return [run for run in page.runs if run.state is not AgentRunState.ENDED]

    async def _enqueue(
        self, subject: str, on_active: OnActive, debounce: timedelta | None = None
    ) -> AgentRun | SubjectBusy:
        message = next(self.messages)
        try:
            run = await self.runs.enqueue(
                "chat",
                workspace="acme",
                subject=subject,
                on_active=on_active,
                payload={"m": message},
                debounce=debounce if on_active is OnActive.MERGE else None,
            )
        except SubjectBusy as busy:
            return busy
        self.said[message] = run.id
        return run

    async def _claim(self, subject: str) -> AgentRun | None:
        claimed = await self.runs.claim_subject("w", "acme", subject, kinds=["chat"])
        if claimed is not None:
            assert claimed.due_at <= self.clock.now()  # a debounced run is not claimed early
            self.read_at_claim.setdefault(claimed.id, await self.runs.inputs(claimed.id))
        return claimed

    def _accepted(self, outcome: AgentRun | SubjectBusy, before: list[AgentRun]) -> None:
        if isinstance(outcome, SubjectBusy):
            assert outcome.run_id in {run.id for run in before}
        else:
            self.enqueued.append(outcome.id)

    @rule(subject=SUBJECTS, on_active=POLICIES, debounce=DEBOUNCES)
    def enqueue(self, subject: str, on_active: OnActive, debounce: timedelta | None) -> None:
        before = self.active(subject)
        outcome = self.run(self._enqueue(subject, on_active, debounce))
        after = self.active(subject)
        self._accepted(outcome, before)
        if isinstance(outcome, SubjectBusy):
            assert on_active is OnActive.REJECT
            assert {run.id for run in after} == {run.id for run in before}
            return
        newest = before[0] if before else None  # listed newest first
        if on_active is OnActive.MERGE and newest is not None and joinable(newest):
            assert outcome.id == newest.id
            assert [run.id for run in after] == [run.id for run in before]
        elif on_active in (OnActive.QUEUE, OnActive.MERGE):
            assert [run.id for run in after][1:] == [run.id for run in before]
        else:
            assert [run.id for run in after] == [outcome.id]
            if on_active is OnActive.INTERRUPT:
                self.ended_by.update((run.id, TerminationReason.CANCELLED) for run in before)
            else:
                assert before == []

    @rule(target=fences, subject=SUBJECTS)
    def claim(self, subject: str) -> AgentRunFence:
        claimed = self.run(self._claim(subject))
        return claimed.fence if claimed is not None else AgentRunFence(UUID(int=0), "acme", 1)

    @rule(fence=fences, reason=st.sampled_from([TerminationReason.COMPLETED]))
    def end(self, fence: AgentRunFence, reason: TerminationReason) -> None:
        try:
            self.run(self.runs.end(fence, reason))
        except (LeaseLost, IllegalTransition, LookupError):
            return
        self.ended_by[fence.run_id] = reason

    @rule(subject=SUBJECTS)
    def cancel_the_first_active(self, subject: str) -> None:
        alive = self.active(subject)
        if alive:
            self.run(self.runs.cancel(alive[-1].id))
            self.ended_by[alive[-1].id] = TerminationReason.CANCELLED

    @rule()
    def time_passes(self) -> None:
        """A debounced run falls due only as the clock moves."""
        self.clock.advance(timedelta(seconds=4))

    @rule(subject=SUBJECTS, one=POLICIES, two=POLICIES)
    def two_enqueues_race_a_claim(self, subject: str, one: OnActive, two: OnActive) -> None:
        before = self.active(subject)

        async def race() -> tuple[AgentRun | SubjectBusy, AgentRun | SubjectBusy, Any]:
            return await asyncio.gather(
                self._enqueue(subject, one, timedelta(seconds=5)),
                self._enqueue(subject, two),
                self._claim(subject),
            )

        first, second, _ = self.run(race())
        for outcome in (first, second):
            if isinstance(outcome, AgentRun):
                self.enqueued.append(outcome.id)
            else:
                assert isinstance(outcome, SubjectBusy)
        for run in before:  # ended by an interrupt, or still there
            if self.run(self.runs.get(run.id)).state is AgentRunState.ENDED:
                self.ended_by.setdefault(run.id, TerminationReason.CANCELLED)
        for outcome in (first, second):
            if isinstance(outcome, AgentRun) and outcome.id not in {
                run.id for run in self.active(subject)
            }:
                self.ended_by.setdefault(outcome.id, TerminationReason.CANCELLED)

    @invariant()
    def one_lease_per_subject_and_no_message_lost(self) -> None:
        for subject in ("c:1", "c:2"):
            leased = [run for run in self.active(subject) if run.state is AgentRunState.LEASED]
            assert len(leased) <= 1
        for run_id in self.enqueued:
            run = self.run(self.runs.get(run_id))
            if run.state is AgentRunState.ENDED:
                assert run.end_reason is self.ended_by.get(run_id), (run, self.ended_by)
        for message, run_id in self.said.items():
            assert {"m": message} in self.run(self.runs.inputs(run_id))
        for run_id, read in self.read_at_claim.items():
            assert self.run(self.runs.inputs(run_id)) == read


def policy_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        stateful_step_count=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


PolicyMachine.TestCase.settings = policy_settings(40)
TestSubjectPolicyInterleavings = PolicyMachine.TestCase
