"""A run, the fence its holder writes under, and the named transitions between its states.

Each transition is pure: it reads the run and the time it is handed and returns a
:class:`RunChange` (the fields a transition may write; a run's identity is not among them), or
raises. The memory adapter applies these directly; the PostgreSQL adapter applies the same rules
in guarded SQL, and the contract suite holds the two together.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from uuid import UUID

from agentruns.domain.bands import Band
from agentruns.domain.errors import (
    IllegalTransition,
    LeaseExpired,
    RetryBudgetExhausted,
    StaleEpoch,
)
from agentruns.domain.failure_records import LastFailure
from agentruns.domain.payload import JsonObject, JsonValue
from agentruns.domain.states import AgentRunState, check_move
from agentruns.domain.termination import TerminationReason


@dataclass(frozen=True, slots=True)
class AgentRunFence:
    """What a holder writes under: the run, its workspace and the epoch of the holder's claim."""

    run_id: UUID
    workspace: str
    epoch: int


@dataclass(frozen=True, slots=True)
class RunChange:
    """The fields a transition writes. Identity (id, kind, workspace, subject) never changes."""

    state: AgentRunState
    epoch: int
    attempt: int
    due_at: datetime
    leased_until: datetime | None
    holder: str | None
    end_reason: TerminationReason | None
    ended_at: datetime | None
    claimed_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class AgentRun:
    """One lease of agent work on one subject.

    ``epoch`` grows by one with each claim and nothing else changes it. ``attempt`` counts the
    attempts that spent the kind's retry budget: a lost (taken back) lease or a charged requeue.
    ``seq`` is the queue order, fixed at enqueue: a requeued run keeps its place in its subject.
    ``lease`` is the kind's lease length when the run was enqueued; claims and renewals lease
    until ``now + lease``. ``domain_row`` says whether its kind kept a domain row when it was
    enqueued (a command that did not load the kind may then still cancel it); ``trace_context``
    is the enqueuer's trace, which the run's spans join; ``last_failure`` is its newest failure.
    ``claimed_at`` is when the current epoch's claim took the run (its queue wait is
    ``claimed_at - due_at`` while it is leased or once it ended; a requeue moves ``due_at``).
    ``key`` is the enqueue key it was enqueued with (:mod:`agentruns.domain.keys`), fixed at
    enqueue; the runs a claim, renewal or end hands back do not read it (``None`` there on
    PostgreSQL), so it does not take part in equality.
    ``waiting_for`` and ``waiting_until`` say what a waiting run waits for (a signal's name;
    ``None`` for a sleep) and until when (ADRs/0025): read by ``get`` and listings, not by the
    claim, renewal or end, so they do not take part in equality either; meaningful while the
    run is QUEUED (:func:`agentruns.domain.waits.is_waiting`); ``waiting_since`` when that wait
    began (a resumed wait keeps it), read alike.
    ``result`` is the JSON value its kind ended it with (``None``: none), written with the end
    (ADRs/0026); read by ``get`` and listings only, so it does not take part in equality.
    ``input_tokens``, ``output_tokens`` and ``cost`` are the totals of its steps' usage
    (ADRs/0033; unknown counts as nothing), added by each step boundary that reported usage;
    read by ``get`` and listings only, so they do not take part in equality.
    """

    id: UUID
    kind: str
    workspace: str
    subject: str
    band: Band
    payload: JsonObject = field(compare=False)
    state: AgentRunState
    epoch: int
    attempt: int
    seq: int
    enqueued_at: datetime
    due_at: datetime
    lease: timedelta = timedelta(seconds=30)
    deadline_at: datetime | None = None
    leased_until: datetime | None = None
    holder: str | None = None
    end_reason: TerminationReason | None = None
    ended_at: datetime | None = None
    continues: UUID | None = None
    domain_row: bool = False
    trace_context: dict[str, str] | None = field(default=None, compare=False)
    last_failure: LastFailure | None = None
    claimed_at: datetime | None = None
    key: str | None = field(default=None, compare=False)
    waiting_for: str | None = field(default=None, compare=False)
    waiting_until: datetime | None = field(default=None, compare=False)
    waiting_since: datetime | None = field(default=None, compare=False)
    result: JsonValue = field(default=None, compare=False)
    input_tokens: int = field(default=0, compare=False)
    output_tokens: int = field(default=0, compare=False)
    cost: Decimal = field(default=Decimal(0), compare=False)

    @property
    def fence(self) -> AgentRunFence:
        """The fence of the current epoch (only meaningful while LEASED)."""
        return AgentRunFence(self.id, self.workspace, self.epoch)

    def changed(self) -> RunChange:
        """The run's writable fields as they stand, to build a change from."""
        return RunChange(
            state=self.state,
            epoch=self.epoch,
            attempt=self.attempt,
            due_at=self.due_at,
            leased_until=self.leased_until,
            holder=self.holder,
            end_reason=self.end_reason,
            ended_at=self.ended_at,
            claimed_at=self.claimed_at,
        )

    def apply(self, change: RunChange) -> AgentRun:
        """The run after ``change``, checked against the state table."""
        check_move(self.state, change.state)
        if change.epoch < self.epoch:
            raise IllegalTransition(self.state, change.state, "the epoch never goes back")
        return replace(
            self,
            state=change.state,
            epoch=change.epoch,
            attempt=change.attempt,
            due_at=change.due_at,
            leased_until=change.leased_until,
            holder=change.holder,
            end_reason=change.end_reason,
            ended_at=change.ended_at,
            claimed_at=change.claimed_at,
        )

    def is_expired(self, now: datetime) -> bool:
        """A LEASED run whose lease ran out (``leased_until`` is not after ``now``)."""
        return (
            self.state is AgentRunState.LEASED
            and self.leased_until is not None
            and self.leased_until <= now
        )

    def is_past_deadline(self, now: datetime) -> bool:
        return self.deadline_at is not None and self.deadline_at <= now


def _require(run: AgentRun, state: AgentRunState, target: AgentRunState) -> None:
    if run.state is not state:
        raise IllegalTransition(run.state, target, f"run {run.id} is {run.state}, not {state}")


def check_fence(run: AgentRun, fence: AgentRunFence, now: datetime) -> None:
    """Refuse a stale epoch (or a run no longer leased), and an expired lease whatever its epoch."""
    if run.id != fence.run_id or run.workspace != fence.workspace:
        raise StaleEpoch(f"fence names run {fence.run_id} in {fence.workspace!r}, not this run")
    if run.state is not AgentRunState.LEASED or run.epoch != fence.epoch:
        raise StaleEpoch(
            f"run {run.id} is {run.state} at epoch {run.epoch}; the fence holds epoch {fence.epoch}"
        )
    if run.is_expired(now):
        raise LeaseExpired(f"the lease of run {run.id} at epoch {run.epoch} has expired")


def note_failure(run: AgentRun, epoch: int, failure: LastFailure) -> AgentRun:
    """The run with ``failure`` as its last one. Only while it is LEASED at ``epoch``: a holder
    records before it requeues or ends (in the same transaction, whose fenced write then checks
    the lease), the reaper before it takes an expired lease back. A state change is not made."""
    if run.state is not AgentRunState.LEASED or run.epoch != epoch:
        raise StaleEpoch(
            f"run {run.id} is {run.state} at epoch {run.epoch}; the failure is of epoch {epoch}"
        )
    return replace(run, last_failure=failure)


def claim(run: AgentRun, *, holder: str, now: datetime) -> RunChange:
    """QUEUED -> LEASED under the next epoch, until ``now + run.lease``. A claim spends no
    attempt."""
    _require(run, AgentRunState.QUEUED, AgentRunState.LEASED)
    return replace(
        run.changed(),
        state=AgentRunState.LEASED,
        epoch=run.epoch + 1,
        leased_until=now + run.lease,
        holder=holder,
        claimed_at=now,
    )


def renew(run: AgentRun, fence: AgentRunFence, *, now: datetime) -> RunChange:
    """LEASED -> LEASED with the lease pushed to ``now + run.lease``; the fence must be current."""
    check_fence(run, fence, now)
    return replace(run.changed(), leased_until=now + run.lease)


def end(
    run: AgentRun, reason: TerminationReason, *, now: datetime, fence: AgentRunFence | None
) -> RunChange:
    """-> ENDED with ``reason``. A holder ends under its fence; ``fence=None`` is an end from
    outside (a cancel, a deadline), allowed from QUEUED or LEASED."""
    if fence is not None:
        check_fence(run, fence, now)
    check_move(run.state, AgentRunState.ENDED)
    return replace(
        run.changed(),
        state=AgentRunState.ENDED,
        leased_until=None,
        end_reason=reason,
        ended_at=now,
    )


def requeue(
    run: AgentRun,
    fence: AgentRunFence,
    *,
    now: datetime,
    due_at: datetime,
    charged: bool,
    retry_budget: int,
) -> RunChange:
    """LEASED -> QUEUED, due at ``due_at``. A charged requeue spends an attempt, and is refused
    once the budget is spent (the caller ends the run instead)."""
    check_fence(run, fence, now)
    attempt = run.attempt + 1 if charged else run.attempt
    if attempt > retry_budget:
        raise RetryBudgetExhausted(
            f"run {run.id} has spent {run.attempt} of {retry_budget} attempts"
        )
    return replace(
        run.changed(),
        state=AgentRunState.QUEUED,
        attempt=attempt,
        due_at=max(due_at, now),
        leased_until=None,
        holder=None,
    )


def take_back(run: AgentRun, *, now: datetime, retry_budget: int, delay: timedelta) -> RunChange:
    """The reaper's move for an expired lease: it spends an attempt.

    Past the deadline it ends DEADLINE_EXCEEDED; with the budget spent it ends
    RETRIES_EXHAUSTED; else it is queued again, due after ``delay``.
    """
    _require(run, AgentRunState.LEASED, AgentRunState.QUEUED)
    if not run.is_expired(now):
        raise IllegalTransition(run.state, AgentRunState.QUEUED, "the lease has not expired")
    if run.is_past_deadline(now):
        return end(run, TerminationReason.DEADLINE_EXCEEDED, now=now, fence=None)
    if run.attempt >= retry_budget:
        return end(run, TerminationReason.RETRIES_EXHAUSTED, now=now, fence=None)
    return replace(
        run.changed(),
        state=AgentRunState.QUEUED,
        attempt=run.attempt + 1,
        due_at=now + delay,
        leased_until=None,
        holder=None,
    )


def expire_queued(run: AgentRun, *, now: datetime) -> RunChange:
    """The reaper's move for a queued run past its deadline: it ends DEADLINE_EXCEEDED."""
    _require(run, AgentRunState.QUEUED, AgentRunState.ENDED)
    if not run.is_past_deadline(now):
        raise IllegalTransition(run.state, AgentRunState.ENDED, "the deadline has not passed")
    return end(run, TerminationReason.DEADLINE_EXCEEDED, now=now, fence=None)


@dataclass(frozen=True, slots=True)
class Continuation:
    """Where a run that continues an ended one starts: its epochs and one more attempt."""

    epoch: int
    attempt: int
    continues: UUID


def continue_after(ended: AgentRun, *, retry_budget: int) -> Continuation:
    """A composition that resumes after its run ended goes on with the ended run's epochs and
    spends one more attempt, so the retry budget bounds how often it resumes."""
    if ended.state is not AgentRunState.ENDED:
        raise IllegalTransition(ended.state, AgentRunState.QUEUED, "only an ended run continues")
    if ended.attempt + 1 > retry_budget:
        raise RetryBudgetExhausted(
            f"run {ended.id} has spent {ended.attempt} of {retry_budget} attempts"
        )
    return Continuation(epoch=ended.epoch, attempt=ended.attempt + 1, continues=ended.id)


def retry_after_end(ended: AgentRun) -> None:
    """An operator's retry goes on only after failed work: a dead-lettered run (not retryable,
    retries exhausted, deadline exceeded) or one a host ended FAILED. A completed, cancelled or
    continued run is not retried (its budget is checked by :func:`continue_after`)."""
    if ended.state is not AgentRunState.ENDED:
        raise IllegalTransition(ended.state, AgentRunState.QUEUED, "only an ended run is retried")
    reason = ended.end_reason
    if reason is None or not (reason.is_dead_letter or reason.is_retryable):
        raise IllegalTransition(
            ended.state,
            AgentRunState.QUEUED,
            f"run {ended.id} ended {reason}: only failed or dead-lettered runs are retried",
        )
