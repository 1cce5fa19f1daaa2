"""The sandbox reaper's take-back rules."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from uuid import UUID

from agentruns.domain.sandbox import (
    AgentSandbox,
    SandboxState,
    SandboxTimings,
    TakeBackCause,
    take_back_cause,
)
from tests.strategies import EPOCH

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
