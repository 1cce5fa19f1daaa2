"""A schedule: recurring runs of a kind, declared in code beside the kinds.

::

    Schedule("daily-digest", kind="digest", cron="0 7 * * *", timezone="Europe/Paris",
             workspace="acme", subject="digest:{date}")

Each tick enqueues one ordinary run (same kinds, bands, workspaces, subjects, fairness and
fencing), due at the tick. The subject is a template over the tick, read in the schedule's
timezone: ``{date}`` (``2026-03-01``), ``{time}`` (``07:00:00``), ``{tick}`` (ISO 8601 with its
offset) and ``{schedule}``; a format spec is a ``strftime`` pattern (``{tick:%G-W%V}``).

After downtime the catch-up policy decides what happens to ticks the scheduler saw more than
``grace`` after their time (ADRs/0015): ``latest`` enqueues only the most recent of them,
``all`` up to ``catch_up_limit`` of the most recent, ``none`` none. Ticks seen within ``grace``
are on time and always enqueued.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from agentruns.domain.bands import Band
from agentruns.domain.errors import InvalidRequest, InvalidSchedule
from agentruns.domain.payload import JsonObject, validate_payload
from agentruns.domain.timing import Cron, Interval, Timing, zone

DEFAULT_GRACE = timedelta(minutes=1)
DEFAULT_CATCH_UP_LIMIT = 10
_MAX_NAME = 200
_MAX_SUBJECT = 512
_SAMPLE_TICK = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)


class CatchUp(enum.StrEnum):
    """What a schedule does with ticks missed while no scheduler ran."""

    LATEST = "latest"
    ALL = "all"
    NONE = "none"

    @classmethod
    def parse(cls, value: object) -> CatchUp:
        try:
            return cls(str(value).lower()) if not isinstance(value, CatchUp) else value
        except ValueError:
            names = ", ".join(policy.value for policy in cls)
            raise InvalidSchedule(f"unknown catch-up {value!r}: expected {names}") from None


class _Moment:
    """A tick value in a subject template: ISO 8601 by default, ``strftime`` with a spec."""

    def __init__(self, value: datetime | date | time, iso: str) -> None:
        self._value = value
        self._iso = iso

    def __format__(self, spec: str) -> str:
        return self._value.strftime(spec) if spec else self._iso


def _text(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidSchedule(f"a schedule's {what} must be a non-empty string, not {value!r}")
    if len(value) > limit:
        raise InvalidSchedule(f"a schedule's {what} is longer than {limit} characters")
    return value


@dataclass(frozen=True, slots=True)
class Schedule:
    """A named schedule of runs of ``kind``: exactly one of ``cron`` (five fields, or six with
    seconds first, in ``timezone``) or ``every`` (a fixed interval of whole seconds)."""

    name: str
    kind: str
    workspace: str
    subject: str
    cron: str | None = None
    every: timedelta | None = None
    timezone: str = "UTC"
    band: Band = Band.BACKGROUND
    payload: JsonObject = field(default_factory=dict)
    catch_up: CatchUp = CatchUp.LATEST
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT
    grace: timedelta = DEFAULT_GRACE
    # Derived from cron or every (and the timezone) when the schedule is built.
    timing: Timing = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        _text(self.name, "name", _MAX_NAME)
        _text(self.kind, "kind", _MAX_NAME)
        _text(self.workspace, "workspace", _MAX_SUBJECT)
        _text(self.subject, "subject template", _MAX_SUBJECT)
        if (self.cron is None) == (self.every is None):
            raise InvalidSchedule(f"schedule {self.name!r} needs exactly one of cron or every")
        zone(self.timezone)
        set_(self, "timing", self._timing())
        if self.cron is not None:
            set_(self, "cron", self.timing.expression)  # type: ignore[attr-defined]
        try:
            set_(self, "band", Band.parse(self.band))
            set_(self, "payload", validate_payload(self.payload))
        except InvalidRequest as exc:
            raise InvalidSchedule(f"schedule {self.name!r}: {exc}") from None
        set_(self, "catch_up", CatchUp.parse(self.catch_up))
        if not isinstance(self.catch_up_limit, int) or self.catch_up_limit < 1:
            raise InvalidSchedule(f"schedule {self.name!r}: catch_up_limit must be at least 1")
        if self.grace < timedelta(0):
            raise InvalidSchedule(f"schedule {self.name!r}: grace cannot be negative")
        _text(self.run_subject(_SAMPLE_TICK), "rendered subject", _MAX_SUBJECT)

    def _timing(self) -> Timing:
        if self.every is not None:
            if not isinstance(self.every, timedelta):
                raise InvalidSchedule(f"schedule {self.name!r}: every must be a timedelta")
            return Interval(self.every)
        return Cron(str(self.cron), self.timezone)

    def run_subject(self, tick: datetime) -> str:
        """The subject of the run enqueued for ``tick``: the template read in the timezone."""
        local = tick.astimezone(zone(self.timezone))
        values = {
            "date": _Moment(local.date(), local.date().isoformat()),
            "time": _Moment(local.time(), local.strftime("%H:%M:%S")),
            "tick": _Moment(local, local.isoformat()),
            "schedule": self.name,
        }
        try:
            return self.subject.format_map(values)
        except KeyError as exc:
            known = ", ".join("{" + name + "}" for name in values)
            raise InvalidSchedule(
                f"schedule {self.name!r}: unknown placeholder {exc} in its subject (use {known})"
            ) from None
        except (ValueError, IndexError, AttributeError) as exc:
            raise InvalidSchedule(f"schedule {self.name!r}: bad subject template: {exc}") from None

    def next_after(self, moment: datetime) -> datetime | None:
        return self.timing.next_after(moment)

    def last_at_or_before(self, moment: datetime) -> datetime | None:
        return self.timing.last_at_or_before(moment)

    def same_timing(self, other: Schedule) -> bool:
        """Whether ``other`` ticks at the same instants (a change of anything else keeps the
        next tick where it is)."""
        return (self.cron, self.every, self.timezone if self.cron else None) == (
            other.cron,
            other.every,
            other.timezone if other.cron else None,
        )


class Schedules:
    """The schedules a host declares, by name (built at composition time, then read-only)."""

    def __init__(self, schedules: Iterable[Schedule] = ()) -> None:
        self._by_name: dict[str, Schedule] = {}
        for schedule in schedules:
            self.add(schedule)

    def add(self, schedule: Schedule) -> None:
        if not isinstance(schedule, Schedule):
            raise InvalidSchedule(f"not a Schedule: {schedule!r}")
        if schedule.name in self._by_name:
            raise InvalidSchedule(f"schedule {schedule.name!r} is declared twice")
        self._by_name[schedule.name] = schedule

    def get(self, name: str) -> Schedule | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def as_mapping(self) -> Mapping[str, Schedule]:
        return dict(self._by_name)

    def __iter__(self) -> Iterator[Schedule]:
        return iter([self._by_name[name] for name in self.names()])

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name
