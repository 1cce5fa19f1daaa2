"""The pure rules of durable waits (ADRs/0025): what a waiting run is, what wakes it, and which
moments the test kit's drain plays."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from agentruns.domain import waits
from agentruns.domain.claim_order import next_moment
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from tests.unit.test_run_transitions import NOW, queued

UNTIL = NOW + timedelta(hours=24)


def test_a_waiting_run_is_queued_with_an_end() -> None:
    assert waits.is_waiting(queued(due_at=UNTIL, waiting_for="approval", waiting_until=UNTIL))
    assert waits.is_waiting(queued(due_at=UNTIL, waiting_until=UNTIL))  # a sleep
    assert not waits.is_waiting(queued())
    ended = queued(
        state=AgentRunState.ENDED,
        waiting_until=UNTIL,
        end_reason=TerminationReason.CANCELLED,
        ended_at=NOW,
    )
    assert not waits.is_waiting(ended)


def test_a_signal_wakes_only_the_run_that_waits_for_it() -> None:
    run = queued(due_at=UNTIL, waiting_for="approval", waiting_until=UNTIL)
    woken = waits.wake(run, name="approval", now=NOW)
    assert woken is not None
    assert (woken.due_at, woken.waiting_for, woken.waiting_until) == (NOW, None, None)
    assert woken.state is AgentRunState.QUEUED
    assert waits.wake(run, name="other", now=NOW) is None
    assert waits.wake(replace(run, waiting_for=None), name="approval", now=NOW) is None  # asleep
    assert waits.wake(queued(), name="approval", now=NOW) is None  # kept for a later wait


def test_a_resumed_wait_is_the_same_wait_only_for_its_name() -> None:
    run = queued(due_at=UNTIL, waiting_for="approval", waiting_until=UNTIL)
    assert waits.same_wait(run, "approval")
    assert not waits.same_wait(run, None)
    assert not waits.same_wait(run, "other")
    assert waits.same_wait(replace(run, waiting_for=None), None)
    assert not waits.same_wait(queued(), "approval")


def test_the_drain_is_not_moved_to_a_signal_wait_s_timeout_but_to_a_sleep_s_end() -> None:
    signal_wait = queued(due_at=UNTIL, waiting_for="approval", waiting_until=UNTIL)
    sleep = queued(
        id=signal_wait.id.__class__(int=2),
        subject="other",
        due_at=UNTIL - timedelta(hours=1),
        waiting_until=UNTIL - timedelta(hours=1),
    )
    assert next_moment([signal_wait], now=NOW, holds={}) == UNTIL
    assert next_moment([signal_wait], now=NOW, holds={}, waits=False) is None
    assert next_moment([signal_wait, sleep], now=NOW, holds={}, waits=False) == sleep.due_at
