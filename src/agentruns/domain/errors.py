"""The one exception root of agentruns, and its tree.

::

    AgentRunsError
    ├── InvalidRequest               bad input refused before anything is written
    │   ├── UnknownKind              no run kind registered under that name
    │   ├── InvalidPayload           the payload is not a JSON object
    │   ├── InvalidBand              no such band
    │   ├── InvalidDuration          not a duration, negative, or longer than a century
    │   ├── KeyConflict              an enqueue key already names a run of another kind,
    │   │                            subject or payload: nothing is written
    │   ├── SubjectBusy              an enqueue under ``reject`` met an active run of its
    │   │                            subject: nothing is written
    │   └── InvalidSchedule          a schedule that cannot tick (cron, timezone, template)
    ├── IllegalTransition            the state table does not allow the move
    ├── RunNotFound                  no run with that id
    ├── RunAlreadyEnded              a signal to a run that has ended: nothing is kept
    ├── ScheduleNotFound             no schedule by that name
    ├── LeaseLost                    the fence is stale or its lease has expired
    │   ├── StaleEpoch               a newer claim took the run
    │   └── LeaseExpired             the lease's leased_until has passed
    ├── RetryBudgetExhausted         continuing would spend more attempts than the kind allows
    ├── RecordedStepError            a recorded step cannot be replayed or recorded (not retryable)
    │   ├── StepOutOfOrder           a resumed run asked for its steps in another order
    │   └── InvalidStepResult        a step's result is not JSON or is too large (also
    │                                InvalidRequest): nothing is recorded
    ├── WaitTimedOut                 a wait's timeout passed before its signal came (not
    │                                retryable when uncaught: a retry would time out again)
    ├── StepTimedOut                 a step ran past its kind's step timeout and was cancelled
    │                                (also a TimeoutError: retryable, class timeout)
    ├── RunWaitTimedOut              ``runs.wait`` gave up before the run ended (also a
    │                                TimeoutError); the run goes on
    ├── SandboxError                 sandbox rows, claims and tokens
    │   ├── SandboxNotLive           the sandbox is DELETING or gone
    │   └── InvalidToken             a token that is missing, forged, expired or revoked
    └── StoreUnavailable             the database could not be reached or answered with an error
        ├── TransactionConflict      a deadlock or serialization failure: retrying may succeed
        └── DatabaseTimeout          a statement ran past its time bound and was cancelled

Adapters translate their driver's errors into this tree (``raise ... from exc``), and the memory
and PostgreSQL adapters raise the same exception for the same conflict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

from agentruns.domain.failures import ConfigurationError

if TYPE_CHECKING:  # the run module imports this one
    from agentruns.domain.run import AgentRun


class AgentRunsError(Exception):
    """Root of every error agentruns raises on purpose."""


class InvalidRequest(AgentRunsError, ValueError):
    """The request was refused before anything was written."""


class UnknownKind(InvalidRequest):
    """No run kind is registered under the given name."""

    def __init__(self, kind: object) -> None:
        shown = repr(kind)
        if len(shown) > 80:
            shown = f"{shown[:80]}... ({len(shown)} characters)"
        super().__init__(f"unknown run kind {shown}: register it before enqueueing")
        self.kind = kind


class InvalidPayload(InvalidRequest):
    """The payload is not a JSON object (a mapping of strings to JSON values)."""


class InvalidBand(InvalidRequest):
    """The band is not one of INTERACTIVE, BATCH, BACKGROUND."""


class InvalidDuration(InvalidRequest):
    """A duration that is not one (``7d``, ``PT30S``), is negative, or is absurdly long."""


class KeyConflict(InvalidRequest):
    """An enqueue's key still names a run (in the same workspace) of another kind, subject or
    payload. Nothing was written; ``run_id`` is the run the key names."""

    def __init__(self, message: str, run_id: UUID | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class SubjectBusy(InvalidRequest):
    """An enqueue whose policy is ``reject`` found a run of its subject that has not ended.
    Nothing was written; ``run_id`` is that run (ADRs/0028)."""

    def __init__(self, message: str, run_id: UUID) -> None:
        super().__init__(message)
        self.run_id = run_id


class UnknownLimit(InvalidRequest, LookupError):
    """A take or a pause names a provider limit that was never declared."""

    def __init__(self, name: object) -> None:
        super().__init__(f"no provider limit named {name!r} is declared (AgentRuns.declare_limit)")
        self.name = name


class LimitExhausted(AgentRunsError, TimeoutError):
    """A take was not granted within its wait: the limit is empty or paused for longer."""

    def __init__(self, name: str, retry_in: float) -> None:
        super().__init__(
            f"provider limit {name!r} granted nothing in time; it may grant in {retry_in:.3g}s"
        )
        self.name = name
        self.retry_in = retry_in


class InvalidSchedule(InvalidRequest):
    """A schedule's definition is refused: its cron expression, interval, timezone, subject
    template, catch-up policy or run fields."""


class IllegalTransition(AgentRunsError):
    """The state table refuses the requested move."""

    def __init__(self, source: object, target: object, detail: str = "") -> None:
        message = f"illegal transition {source} -> {target}"
        super().__init__(f"{message}: {detail}" if detail else message)
        self.source = source
        self.target = target


class RunNotFound(AgentRunsError, LookupError):
    """No run carries the given id."""


class RunAlreadyEnded(AgentRunsError):
    """A signal was delivered to a run that has ended: nothing was kept (ADRs/0025)."""


class ScheduleNotFound(AgentRunsError, LookupError):
    """No schedule carries the given name."""


class LeaseLost(AgentRunsError):
    """The holder's fence no longer holds the run; it must stop without settling."""


class StaleEpoch(LeaseLost):
    """A newer claim (or an end) took the run from this fence's epoch."""


class LeaseExpired(LeaseLost):
    """The fence's epoch is current but its lease ran out; the reaper may take it back."""


class RetryBudgetExhausted(AgentRunsError):
    """The kind's retry budget does not allow another attempt."""


class RecordedStepError(AgentRunsError, ConfigurationError):
    """A recorded step cannot be replayed or recorded (ADRs/0022). The kind's code and its
    recorded history disagree, or a step's result cannot be stored: running the run again would
    meet the same answer, so the run ends ``not_retryable`` (class ``configuration``), whatever
    the kind's own classifier says."""


class StepOutOfOrder(RecordedStepError):
    """A resumed run asked for a step other than the one recorded at that place (or returned
    with recorded steps it never asked for): its result is never guessed."""


class InvalidStepResult(RecordedStepError, InvalidRequest):
    """A step's result is not a JSON value, or its record would pass the JSON size limits
    (:mod:`agentruns.domain.limits`): nothing is recorded."""


class InvalidRunResult(InvalidPayload, ConfigurationError):
    """A run's result is not a JSON value within the payload limits (ADRs/0026): the end is
    refused and nothing is written. Met by a worker ending a kind's run, the run ends
    ``not_retryable`` (class ``configuration``): a retry would give the same result."""


class WaitTimedOut(AgentRunsError, ConfigurationError):
    """``ctx.wait_for`` saw its timeout pass before its signal came (ADRs/0025). A kind may
    catch it; uncaught, it ends the run ``not_retryable`` with its failure record: a retry would
    replay the same recorded timeout. ``name`` is the signal waited for."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class RunWaitTimedOut(AgentRunsError, TimeoutError):
    """:meth:`AgentRuns.wait <agentruns.app.runs.AgentRuns.wait>` saw its timeout pass before
    the run ended. Nothing about the run changes (it goes on); ``run`` is the run as last read,
    ``timeout`` the seconds waited."""

    def __init__(self, run: AgentRun, timeout: float) -> None:
        super().__init__(
            f"run {run.id} had not ended after {timeout:g} s: it is {run.state.value} "
            f"at epoch {run.epoch}"
        )
        self.run = run
        self.timeout = timeout


class StepTimedOut(AgentRunsError, TimeoutError):
    """A step ran past its kind's ``step_timeout`` and the worker cancelled it. A timeout, so
    retryable by the default rules (class ``timeout``): the run is requeued after its backoff
    with the attempt's failure recorded."""


class SandboxError(AgentRunsError):
    """A sandbox row, claim or token was refused."""


class SandboxNotLive(SandboxError):
    """The sandbox is being deleted or no longer exists."""


class InvalidToken(SandboxError):
    """A sandbox token or an approval link (ADRs/0027) that is missing, forged, expired or
    revoked."""


class StoreUnavailable(AgentRunsError):
    """The run store could not be reached, or failed in a way the caller cannot fix."""


class TransactionConflict(StoreUnavailable):
    """The database aborted the transaction to break a deadlock or a serialization conflict;
    nothing it wrote stays, and running it again may succeed."""


class DatabaseTimeout(StoreUnavailable):
    """A statement ran past its time bound (a ``statement_timeout``, a ``lock_timeout``, or the
    client's own bound) and was cancelled; its transaction wrote nothing. ``seconds`` is the
    bound, when known. Retrying later may succeed: something held the database up."""

    def __init__(self, message: str, seconds: float | None = None) -> None:
        super().__init__(message)
        self.seconds = seconds
