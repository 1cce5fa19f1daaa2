"""Why a run ended, what a worker step came to, and what to do after a failure."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta
from typing import assert_never

from agentruns.domain.failures import FailureClass


class TerminationReason(enum.StrEnum):
    """The reason axis of an ENDED run; dead-letter is ENDED with a non-retryable reason."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    RETRIES_EXHAUSTED = "retries_exhausted"
    NOT_RETRYABLE = "not_retryable"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CONTINUED = "continued"

    @property
    def is_retryable(self) -> bool:
        """Whether work ended for this reason could succeed if tried again.

        Only a plain FAILED is retryable: a host that ends a run FAILED without classifying
        leaves the door open; the dead-letter reasons and the deliberate ends close it.
        """
        return self is TerminationReason.FAILED

    @property
    def is_dead_letter(self) -> bool:
        """An end that an operator should look at: failed work that will not be retried."""
        return self in _DEAD_LETTER


_DEAD_LETTER = frozenset(
    {
        TerminationReason.RETRIES_EXHAUSTED,
        TerminationReason.NOT_RETRYABLE,
        TerminationReason.DEADLINE_EXCEEDED,
    }
)


class RunOutcome(enum.StrEnum):
    """What one worker pass over a run came to."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"
    LEASE_LOST = "lease_lost"
    # The run gave its lease back to wait for a signal or to sleep (ADRs/0025): not a failure.
    WAITING = "waiting"


@dataclass(frozen=True, slots=True)
class EndRun:
    """Recovery decision: end the run with this reason (dead-letter)."""

    reason: TerminationReason


@dataclass(frozen=True, slots=True)
class RequeueRun:
    """Recovery decision: a charged requeue, due again after the given attempt's backoff."""

    attempt: int


# How long a run given back waits before it is offered again: long enough that a holder whose
# claim still offers it (a registry that differs from its claim's kinds) does not spin on it,
# short enough that a holder that knows the kind is barely delayed.
GIVE_BACK_DELAY = timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Recovery decision: queue the run again without spending an attempt, due after ``delay``.

    The holder could not run it at all (its kind is not registered there): no step ran, so the
    run's budget, which bounds failures of its work, is not charged, and a holder that knows
    the kind takes it next.
    """

    delay: timedelta = GIVE_BACK_DELAY


Recovery = EndRun | RequeueRun | GiveBack


def decide_recovery(failure: FailureClass, attempt: int, retry_budget: int) -> Recovery:
    """What a worker does after a step failed.

    ``attempt`` is the run's attempts spent so far; a requeue would spend one more. Not
    retryable ends NOT_RETRYABLE; retryable with the budget spent ends RETRIES_EXHAUSTED; else a
    charged requeue. The decision never requeues past the budget. A run whose kind the holder
    does not know is given back uncharged (:class:`GiveBack`): it is not the run that failed.
    """
    match failure:
        case FailureClass.UNKNOWN_KIND:
            return GiveBack()
        case FailureClass.AUTH | FailureClass.CONFIGURATION | FailureClass.CLIENT_ERROR:
            return EndRun(TerminationReason.NOT_RETRYABLE)
        case (
            FailureClass.RATE_LIMITED
            | FailureClass.SERVER_ERROR
            | FailureClass.TIMEOUT
            | FailureClass.CONNECTION
            | FailureClass.LEASE_EXPIRED
            | FailureClass.UNKNOWN
        ):
            if attempt >= retry_budget:
                return EndRun(TerminationReason.RETRIES_EXHAUSTED)
            return RequeueRun(attempt + 1)
        case _:
            assert_never(failure)
