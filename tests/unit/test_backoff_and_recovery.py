"""Backoff stays in bounds; the recovery decision never requeues past the budget."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given, strategies as st

from agentruns.domain.backoff import Backoff
from agentruns.domain.failures import FailureClass
from agentruns.domain.termination import (
    EndRun,
    GiveBack,
    RequeueRun,
    TerminationReason,
    decide_recovery,
)
from tests.strategies import attempts, backoffs


@given(backoffs(), attempts, st.integers(min_value=0, max_value=2**32 - 1))
def test_backoff_stays_within_zero_and_the_cap(backoff: Backoff, attempt: int, seed: int) -> None:
    delay = backoff.delay(attempt, random.Random(seed))
    assert timedelta(0) <= delay <= backoff.cap


@given(backoffs(), attempts)
def test_the_jitter_free_backoff_never_decreases(backoff: Backoff, attempt: int) -> None:
    assert backoff.base_delay(attempt) <= backoff.base_delay(attempt + 1)


def test_backoff_doubles_from_its_base_up_to_its_cap() -> None:
    backoff = Backoff(base=timedelta(seconds=5), cap=timedelta(seconds=30), jitter=0.0)
    delays = [backoff.base_delay(n).total_seconds() for n in range(1, 6)]
    assert delays == [5, 10, 20, 30, 30]


def test_a_huge_attempt_saturates_at_the_cap() -> None:
    backoff = Backoff(base=timedelta(seconds=1), cap=timedelta(hours=1))
    assert backoff.base_delay(10_000) == timedelta(hours=1)


@pytest.mark.parametrize(
    "bad",
    [
        {"base": timedelta(seconds=-1)},
        {"multiplier": 0.5},
        {"jitter": 1.5},
    ],
)
def test_a_nonsense_backoff_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**bad)  # type: ignore[arg-type]


@given(st.sampled_from(list(FailureClass)), attempts, st.integers(min_value=0, max_value=10))
def test_recovery_never_requeues_past_the_budget(
    failure: FailureClass, attempt: int, budget: int
) -> None:
    decision = decide_recovery(failure, min(attempt, budget), budget)
    if isinstance(decision, RequeueRun):
        assert failure.is_retryable
        assert decision.attempt <= budget
    elif isinstance(decision, GiveBack):
        assert failure is FailureClass.UNKNOWN_KIND  # spends nothing: no budget to pass
    else:
        assert decision.reason in {
            TerminationReason.NOT_RETRYABLE,
            TerminationReason.RETRIES_EXHAUSTED,
        }


@pytest.mark.parametrize(
    ("failure", "attempt", "expected"),
    [
        (FailureClass.AUTH, 0, EndRun(TerminationReason.NOT_RETRYABLE)),
        (FailureClass.CLIENT_ERROR, 0, EndRun(TerminationReason.NOT_RETRYABLE)),
        (FailureClass.CONFIGURATION, 2, EndRun(TerminationReason.NOT_RETRYABLE)),
        (FailureClass.SERVER_ERROR, 0, RequeueRun(1)),
        (FailureClass.RATE_LIMITED, 2, RequeueRun(3)),
        (FailureClass.TIMEOUT, 3, EndRun(TerminationReason.RETRIES_EXHAUSTED)),
        (FailureClass.UNKNOWN, 3, EndRun(TerminationReason.RETRIES_EXHAUSTED)),
        # The holder did not know the kind: nothing ran, another holder may; budget or not.
        (FailureClass.UNKNOWN_KIND, 0, GiveBack()),
        (FailureClass.UNKNOWN_KIND, 3, GiveBack()),
    ],
)
def test_recovery_by_failure_class_and_budget(
    failure: FailureClass, attempt: int, expected: object
) -> None:
    """With the default budget of 3: final classes dead-letter at once; others retry thrice."""
    assert decide_recovery(failure, attempt, 3) == expected


def test_dead_letter_reasons_are_not_retryable() -> None:
    for reason in TerminationReason:
        if reason.is_dead_letter:
            assert not reason.is_retryable
    assert TerminationReason.FAILED.is_retryable
    assert not TerminationReason.COMPLETED.is_retryable
