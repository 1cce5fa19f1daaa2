"""The sandbox reaper's take-back rules."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from uuid import UUID

import pytest
from hypothesis import given, strategies as st

from agentruns.domain.errors import IllegalTransition, SandboxNotLive
from agentruns.domain.run import AgentRun
from agentruns.domain.sandbox import (
    AgentSandbox,
    LeaseRefusal,
    SandboxState,
    SandboxTimings,
    TakeBackCause,
    lease_refusal,
    mark_deleting,
    mark_ready,
    mark_used,
    take_back_cause,
    usable,
)
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from agentruns.entrypoints.container import sandbox_timings
from agentruns.entrypoints.settings import AgentRunsSettings
from tests.strategies import EPOCH, runs

TIMINGS = SandboxTimings()
SANDBOX = AgentSandbox(
    id=UUID(int=1),
    kind="reviewer",
    workspace="ws",
    subject="review:1",
    state=SandboxState.REQUESTED,
    requested_at=EPOCH,
    shutdown_at=EPOCH + timedelta(hours=1),
    claim_name="sbx-1",
)


def cause(sandbox: AgentSandbox, after: timedelta, *, work: bool = False) -> TakeBackCause | None:
    return take_back_cause(sandbox, EPOCH + after, TIMINGS, subject_has_work=work)


def test_a_sandbox_past_its_shutdown_is_taken_back() -> None:
    ready = replace(SANDBOX, state=SandboxState.READY, ready_at=EPOCH, last_used_at=EPOCH)
    assert cause(ready, timedelta(hours=1), work=True) is TakeBackCause.SHUTDOWN


def test_a_sandbox_that_never_called_is_taken_back_after_the_start_limit() -> None:
    assert cause(SANDBOX, timedelta(minutes=2) - timedelta(seconds=1), work=True) is None
    assert cause(SANDBOX, timedelta(minutes=2), work=True) is TakeBackCause.NOT_STARTED


def test_an_idle_sandbox_is_taken_back_after_a_minute() -> None:
    ready = replace(SANDBOX, state=SandboxState.READY, ready_at=EPOCH, last_used_at=EPOCH)
    assert cause(ready, timedelta(seconds=59)) is None
    assert cause(ready, timedelta(minutes=1)) is TakeBackCause.IDLE


def test_a_sandbox_whose_subject_has_work_is_not_idle() -> None:
    ready = replace(SANDBOX, state=SandboxState.READY, ready_at=EPOCH, last_used_at=EPOCH)
    assert cause(ready, timedelta(minutes=30), work=True) is None


def test_a_conversation_sandbox_idles_for_fifteen_minutes() -> None:
    ready = replace(
        SANDBOX, state=SandboxState.READY, ready_at=EPOCH, last_used_at=EPOCH, conversation=True
    )
    assert cause(ready, timedelta(minutes=14)) is None
    assert cause(ready, timedelta(minutes=15)) is TakeBackCause.IDLE


def test_a_deleting_sandbox_is_not_taken_back_again() -> None:
    deleting = replace(SANDBOX, state=SandboxState.DELETING)
    assert cause(deleting, timedelta(days=1)) is None


def test_the_first_call_marks_a_sandbox_ready_once() -> None:
    """REQUESTED -> READY records when; a later call leaves ready_at alone."""
    ready = mark_ready(SANDBOX, EPOCH + timedelta(seconds=5))
    assert ready.state is SandboxState.READY
    assert ready.ready_at == EPOCH + timedelta(seconds=5)
    assert mark_ready(ready, EPOCH + timedelta(minutes=1)) == ready


def test_a_deleting_sandbox_is_neither_ready_nor_used_nor_usable() -> None:
    """Once taken back, a sandbox accepts no call and its token stops."""
    deleting = mark_deleting(SANDBOX)
    with pytest.raises(SandboxNotLive):
        mark_ready(deleting, EPOCH)
    with pytest.raises(SandboxNotLive):
        mark_used(deleting, EPOCH)
    with pytest.raises(IllegalTransition):
        mark_deleting(deleting)
    assert not usable(deleting, EPOCH)


def test_a_sandbox_is_usable_until_its_shutdown() -> None:
    """Live and before shutdown: the token works; at shutdown it stops."""
    assert usable(SANDBOX, EPOCH + timedelta(minutes=59))
    assert not usable(SANDBOX, SANDBOX.shutdown_at)


def test_a_lease_moves_the_idle_clock() -> None:
    """mark_used sets last_used_at, from which the idle limit counts."""
    used = mark_used(mark_ready(SANDBOX, EPOCH), EPOCH + timedelta(minutes=5))
    assert used.last_used_at == EPOCH + timedelta(minutes=5)
    assert (
        take_back_cause(
            used, EPOCH + timedelta(minutes=5, seconds=59), TIMINGS, subject_has_work=False
        )
        is None
    )


def test_the_take_back_limits_come_from_the_settings() -> None:
    """AGENTRUNS_SANDBOX_START, _SANDBOX_IDLE and _CONVERSATION_SANDBOX_IDLE set the reaper's."""
    settings = AgentRunsSettings(
        sandbox_start=timedelta(minutes=3),
        sandbox_idle=timedelta(seconds=90),
        conversation_sandbox_idle=timedelta(minutes=20),
    )
    assert sandbox_timings(settings) == SandboxTimings(
        start=timedelta(minutes=3),
        idle=timedelta(seconds=90),
        conversation_idle=timedelta(minutes=20),
    )
    assert sandbox_timings(AgentRunsSettings()) == SandboxTimings()


@given(
    run=runs(0),
    workspace=st.sampled_from(["ws-a", "ws-b"]),
    subject=st.sampled_from(["review:1", "review:2"]),
    epochs=st.tuples(st.integers(min_value=1, max_value=2), st.integers(min_value=1, max_value=2)),
    reason=st.sampled_from([None, *TerminationReason]),
)
def test_a_refused_fence_names_how_its_run_ended_only_in_the_sandboxs_subject(
    run: AgentRun,
    workspace: str,
    subject: str,
    epochs: tuple[int, int],
    reason: TerminationReason | None,
) -> None:
    """Cancelled or ended only for a run of the sandbox's own workspace and subject that ended at
    the fence's epoch; anything else is a lost lease."""
    sandbox = replace(SANDBOX, workspace="ws-a", subject="review:1")
    run_epoch, epoch = epochs
    run = replace(run, workspace=workspace, subject=subject, epoch=run_epoch)
    if run.state is AgentRunState.ENDED:
        run = replace(run, end_reason=reason)
    refusal = lease_refusal(run, sandbox, epoch)
    own = (workspace, subject) == ("ws-a", "review:1")
    if not (own and run_epoch == epoch and run.state is AgentRunState.ENDED):
        assert refusal is LeaseRefusal.LEASE_LOST
    elif reason is TerminationReason.CANCELLED:
        assert refusal is LeaseRefusal.CANCELLED
    else:
        assert refusal is LeaseRefusal.ENDED
    assert lease_refusal(None, sandbox, epoch) is LeaseRefusal.LEASE_LOST
