"""Sandbox states, the take-back rules of the sandbox reaper, and why a sandbox's fenced call was
refused, as pure predicates."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from uuid import UUID

from agentruns.domain.errors import IllegalTransition, LeaseLost, SandboxNotLive
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason


class SandboxState(enum.StrEnum):
    REQUESTED = "requested"
    READY = "ready"
    DELETING = "deleting"


SANDBOX_TRANSITIONS: dict[SandboxState, frozenset[SandboxState]] = {
    SandboxState.REQUESTED: frozenset({SandboxState.READY, SandboxState.DELETING}),
    SandboxState.READY: frozenset({SandboxState.DELETING}),
    SandboxState.DELETING: frozenset(),
}

LIVE_SANDBOX_STATES = frozenset({SandboxState.REQUESTED, SandboxState.READY})


def check_sandbox_move(source: SandboxState, target: SandboxState) -> None:
    if target not in SANDBOX_TRANSITIONS[source]:
        raise IllegalTransition(source, target)


@dataclass(frozen=True, slots=True)
class SandboxTimings:
    """How long a sandbox may take to start, and stay idle (longer for a conversation)."""

    start: timedelta = timedelta(minutes=2)
    idle: timedelta = timedelta(minutes=1)
    conversation_idle: timedelta = timedelta(minutes=15)


@dataclass(frozen=True, slots=True)
class AgentSandbox:
    id: UUID
    kind: str
    workspace: str
    subject: str
    state: SandboxState
    requested_at: datetime
    shutdown_at: datetime
    claim_name: str
    conversation: bool = False
    ready_at: datetime | None = None
    last_used_at: datetime | None = None

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_SANDBOX_STATES


def mark_ready(sandbox: AgentSandbox, now: datetime) -> AgentSandbox:
    """The sandbox called the gateway: REQUESTED -> READY at ``now`` (never before its request);
    READY stays as it is."""
    if sandbox.state is SandboxState.READY:
        return sandbox
    if not usable(sandbox, now):
        raise SandboxNotLive(f"sandbox {sandbox.id} is {sandbox.state} or past its shutdown")
    check_sandbox_move(sandbox.state, SandboxState.READY)
    return replace(sandbox, state=SandboxState.READY, ready_at=max(now, sandbox.requested_at))


def mark_used(sandbox: AgentSandbox, now: datetime) -> AgentSandbox:
    """The sandbox leased a run at ``now``: its idle clock starts again.

    The last use never moves back (a call whose transaction started earlier may lease after a
    later one) and never passes the first call or the shutdown: a sandbox past its shutdown is
    used no more, so ``last_used_at`` cannot keep it from idling beyond its life."""
    if not usable(sandbox, now) or sandbox.ready_at is None:
        raise SandboxNotLive(f"sandbox {sandbox.id} is not ready, or past its shutdown")
    latest = max(now, sandbox.ready_at, sandbox.last_used_at or sandbox.ready_at)
    return replace(sandbox, last_used_at=latest)


def mark_deleting(sandbox: AgentSandbox) -> AgentSandbox:
    """Take the sandbox back: its claim is to be deleted, and its token no longer works."""
    check_sandbox_move(sandbox.state, SandboxState.DELETING)
    return replace(sandbox, state=SandboxState.DELETING)


def usable(sandbox: AgentSandbox, now: datetime) -> bool:
    """A token of this sandbox works now: it is live and before its shutdown."""
    return sandbox.is_live and not shutdown_passed(sandbox, now)


class TakeBackCause(enum.StrEnum):
    SHUTDOWN = "shutdown"
    NOT_STARTED = "not_started"
    IDLE = "idle"


def shutdown_passed(sandbox: AgentSandbox, now: datetime) -> bool:
    return sandbox.shutdown_at <= now


def not_started(sandbox: AgentSandbox, now: datetime, timings: SandboxTimings) -> bool:
    """It has not called the gateway within ``start`` of its request."""
    return sandbox.state is SandboxState.REQUESTED and sandbox.requested_at + timings.start <= now


def idle(
    sandbox: AgentSandbox, now: datetime, timings: SandboxTimings, *, subject_has_work: bool
) -> bool:
    """Its subject has no queued or leased run, and it leased none for its idle limit.

    The idle clock starts at its last lease, else at its first call, else at its request.
    """
    if subject_has_work:
        return False
    limit = timings.conversation_idle if sandbox.conversation else timings.idle
    since = sandbox.last_used_at or sandbox.ready_at or sandbox.requested_at
    return since + limit <= now


def take_back_cause(
    sandbox: AgentSandbox, now: datetime, timings: SandboxTimings, *, subject_has_work: bool
) -> TakeBackCause | None:
    """Why the sandbox reaper takes a live sandbox back now, or ``None`` to leave it."""
    if not sandbox.is_live:
        return None
    if shutdown_passed(sandbox, now):
        return TakeBackCause.SHUTDOWN
    if not_started(sandbox, now, timings):
        return TakeBackCause.NOT_STARTED
    if idle(sandbox, now, timings, subject_has_work=subject_has_work):
        return TakeBackCause.IDLE
    return None


class LeaseRefusal(enum.StrEnum):
    """Why a sandbox's renew or end under ``epoch`` was refused, as the gateway answers it: the
    run was taken from that epoch (or is not the sandbox's to know about), cancelled at that
    epoch, or ended at that epoch another way (its deadline, its own end)."""

    LEASE_LOST = "lease_lost"
    CANCELLED = "cancelled"
    ENDED = "ended"


def lease_refusal(run: AgentRun | None, sandbox: AgentSandbox, epoch: int) -> LeaseRefusal:
    """The refusal of a fenced call at ``epoch`` whose fence did not hold, given the run as it
    is now. Only a run of the sandbox's own workspace and subject that ended at that very epoch
    says how it ended; any other run, or none, is a lost lease, so a refusal tells a sandbox
    nothing of runs outside its subject."""
    if (
        run is None
        or run.workspace != sandbox.workspace
        or run.subject != sandbox.subject
        or run.epoch != epoch
        or run.state is not AgentRunState.ENDED
    ):
        return LeaseRefusal.LEASE_LOST
    if run.end_reason is TerminationReason.CANCELLED:
        return LeaseRefusal.CANCELLED
    return LeaseRefusal.ENDED


class SandboxLeaseRefused(LeaseLost):
    """A sandbox's fence no longer holds its run, and why (:class:`LeaseRefusal`)."""

    def __init__(self, run_id: UUID, reason: LeaseRefusal) -> None:
        super().__init__(f"the lease of run {run_id} does not hold: {reason}")
        self.run_id = run_id
        self.reason = reason
