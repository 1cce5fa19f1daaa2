"""What agentruns accepts at its edge, and the documented limits of every input it stores.

Every value a host hands :class:`~agentruns.app.runs.AgentRuns` is checked here before anything is
written, so a bad value is an :class:`~agentruns.domain.errors.InvalidRequest` on every adapter
(never an outage, never half a write), and a value that is accepted reads back equal:

==========================  =====================================================================
names                       workspace, subject, holder, event type, kind, enqueue key, signal
                            name and signal id: text of 1 to :data:`MAX_NAME_LENGTH`
                            characters, not only blanks
text                        every string, names and payload alike: valid Unicode (no lone
                            surrogate, so it encodes as UTF-8) and no NUL character, which
                            PostgreSQL cannot store
payloads and event data     a JSON object (:mod:`agentruns.domain.payload`): at most
                            :data:`MAX_JSON_BYTES` as compact UTF-8 JSON, nested at most
                            :data:`MAX_JSON_DEPTH` deep; integers within 64 bits
                            (:data:`MAX_JSON_INTEGER`); other numbers finite and below
                            :data:`MAX_JSON_FLOAT` in magnitude, where every JSON reader (and
                            PostgreSQL's jsonb) keeps them exactly; a signal's payload is any
                            JSON value that fits, with its name and id, a recorded step
times                       timezone-aware datetimes whose UTC time falls within the years 1 to
                            9999; a run's ``deadline_at`` after its ``due_at``
durations                   a kind's lease longer than zero and at most :data:`MAX_LEASE`; its
                            deadline longer than zero and at most :data:`MAX_DEADLINE`; a
                            requeue delay, a backoff cap, a wait's timeout and a durable
                            sleep at most :data:`MAX_DELAY`; a
                            purge's retention and a kind's key retention at most
                            :data:`MAX_RETENTION`; a schedule's period at most
                            :data:`MAX_PERIOD`; a rolling budget's window at most
                            :data:`MAX_BUDGET_WINDOW`
epochs                      integers from 0 to :data:`MAX_EPOCH` (PostgreSQL's ``integer``)
==========================  =====================================================================
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from agentruns.domain.errors import InvalidRequest

MAX_NAME_LENGTH = 512
MAX_JSON_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 64
MAX_JSON_INTEGER = 2**63 - 1
MAX_JSON_FLOAT = float(2**53)
MAX_EPOCH = 2**31 - 1
MAX_LEASE = timedelta(days=1)
MAX_DEADLINE = timedelta(days=366)
MAX_DELAY = timedelta(days=366)
# Further back than this is before any run (and, far enough, before the year 1).
MAX_RETENTION = timedelta(days=36_500)
# A schedule ticks at least once a century (the durations parser's longest, too).
MAX_PERIOD = timedelta(days=36_500)
# A rolling budget's window: every charge of its workspace sums the window's ledger rows, so at
# most a leap year of them.
MAX_BUDGET_WINDOW = timedelta(days=366)

_SHOWN = 80


def shown(value: object) -> str:
    """``repr(value)``, cut short: an error message never carries a whole huge input."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


def check_text(value: str, what: str) -> str:
    """``value`` if PostgreSQL can store it as text: valid Unicode and no NUL."""
    if "\x00" in value:
        raise InvalidRequest(f"{what} holds a NUL character, which cannot be stored")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"{what} is not valid Unicode (it holds a lone surrogate)") from None
    return value


def name(value: object, what: str) -> str:
    """A name: text of 1 to :data:`MAX_NAME_LENGTH` characters, not only blanks."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{what} must be a non-empty string, not {shown(value)}")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidRequest(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    return check_text(value, what)


def optional_moment(value: object, what: str) -> datetime | None:
    """``None``, or a timezone-aware datetime within the years 1 to 9999 in UTC."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidRequest(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidRequest(f"{what} must be timezone-aware")
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise InvalidRequest(f"{what} falls outside the years 1 to 9999 in UTC") from None
    return value


def moment(value: object, what: str) -> datetime:
    """A timezone-aware datetime within the years 1 to 9999 in UTC."""
    checked = optional_moment(value, what)
    if checked is None:
        raise InvalidRequest(f"{what} must be a datetime, not None")
    return checked


def duration(value: object, what: str, *, longest: timedelta, zero: bool = False) -> timedelta:
    """A timedelta longer than zero (or zero, if allowed) and at most ``longest``."""
    if not isinstance(value, timedelta):
        raise InvalidRequest(f"{what} must be a timedelta, not {type(value).__name__}")
    if value < timedelta(0) or (value == timedelta(0) and not zero):
        raise InvalidRequest(f"{what} must be longer than zero, not {value}")
    if value > longest:
        raise InvalidRequest(f"{what} must be at most {longest}, not {value}")
    return value


def epoch(value: object, what: str = "epoch") -> int:
    """An epoch: an integer from 0 to :data:`MAX_EPOCH`."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_EPOCH:
        raise InvalidRequest(f"{what} must be an integer from 0 to {MAX_EPOCH}, not {shown(value)}")
    return value


def run_id(value: object) -> UUID:
    if not isinstance(value, UUID):
        raise InvalidRequest(f"a run id is a UUID, not {type(value).__name__}")
    return value


def deadline_after_due(due_at: datetime | None, deadline_at: datetime | None) -> None:
    """A deadline given with a due time comes after it (else the run could never run)."""
    if due_at is not None and deadline_at is not None and deadline_at <= due_at:
        raise InvalidRequest(f"deadline_at {deadline_at} is not after due_at {due_at}")
