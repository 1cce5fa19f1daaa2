"""When a schedule ticks: a cron expression in a timezone, or a fixed interval.

Both are pure functions of an instant (no clock read): :meth:`Timing.next_after` is the first
tick strictly after a moment, :meth:`Timing.last_at_or_before` the last tick at or before one.
Ticks are aware UTC datetimes on whole seconds, identical on every replica.

A cron expression (five fields, or six with seconds first; parsed by ``cronsim``) names local
wall-clock times in its timezone. Each matching local time fires exactly once (ADRs/0015):

- a local time the clocks skip (spring forward) fires at the next valid time, the instant the
  clocks jump, so ``30 2 * * *`` runs at 03:00 on that day, once;
- a local time the clocks repeat (fall back) fires at its first occurrence only.

So a wall time is mapped to an instant by its first occurrence, and a skipped one by the jump;
that map never goes backwards in time, which is what lets ``next_after`` start its walk at the
local time of the moment. A fixed interval counts whole seconds from the Unix epoch in absolute
time: every replica computes the same ticks, and DST does not touch them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from agentruns.domain.errors import InvalidSchedule
from agentruns.domain.limits import MAX_PERIOD

UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


class Timing(Protocol):
    """How a schedule's ticks fall in time."""

    def next_after(self, moment: datetime) -> datetime | None:
        """The first tick strictly after ``moment`` (``None``: never again)."""
        ...

    def last_at_or_before(self, moment: datetime) -> datetime | None:
        """The last tick at or before ``moment`` (``None``: none in the searchable past)."""
        ...


@lru_cache(maxsize=256)
def zone(name: str) -> ZoneInfo:
    """The IANA timezone ``name``; :class:`InvalidSchedule` if there is none by that name."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidSchedule(f"unknown timezone {name!r}: use an IANA name such as UTC") from exc


def _aware(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("schedule times must be timezone-aware")
    return moment.astimezone(UTC)


def _floor_second(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)


@dataclass(frozen=True, slots=True)
class Interval:
    """Every ``every`` (whole seconds, at least one, at most :data:`MAX_PERIOD`), counted from
    the Unix epoch. A tick past the year 9999 (or before the year 1) is none."""

    every: timedelta

    def __post_init__(self) -> None:
        if self.every < _SECOND or self.every % _SECOND:
            raise InvalidSchedule(f"an interval is whole seconds, at least 1 s, not {self.every}")
        if self.every > MAX_PERIOD:
            raise InvalidSchedule(
                f"an interval is at most {MAX_PERIOD.days} days, not {self.every.days} days"
            )

    def next_after(self, moment: datetime) -> datetime | None:
        elapsed = _aware(moment) - UNIX_EPOCH
        return _tick(elapsed // self.every + 1, self.every)

    def last_at_or_before(self, moment: datetime) -> datetime | None:
        elapsed = _aware(moment) - UNIX_EPOCH
        return _tick(elapsed // self.every, self.every)


def _tick(count: int, every: timedelta) -> datetime | None:
    try:
        return UNIX_EPOCH + count * every
    except OverflowError:
        return None


@dataclass(frozen=True, slots=True)
class Cron:
    """A cron expression over local wall-clock time in ``timezone`` (see the module's DST
    rules). ``expression`` is kept normalised (single spaces), as it is stored."""

    expression: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        normalised = " ".join(str(self.expression).split())
        object.__setattr__(self, "expression", normalised)
        zone(self.timezone)
        try:
            CronSim(normalised, datetime(2000, 1, 1))
        except CronSimError as exc:
            raise InvalidSchedule(f"bad cron expression {normalised!r}: {exc}") from None

    def next_after(self, moment: datetime) -> datetime | None:
        moment = _aware(moment)
        tz = zone(self.timezone)
        # Every wall time before the moment's own maps to an instant at or before the moment
        # (the map is monotone and the moment's wall time maps to itself or its earlier twin).
        walls = self._walk(moment.astimezone(tz).replace(tzinfo=None, fold=0), reverse=False)
        for wall in walls:
            tick = first_instant(wall, tz)
            if tick > moment:
                return tick
        return None

    def last_at_or_before(self, moment: datetime) -> datetime | None:
        moment = _aware(moment)
        tz = zone(self.timezone)
        local = moment.astimezone(tz)
        wall = local.replace(tzinfo=None, fold=0)
        # In the second pass of a repeated hour, the rest of that hour's wall times map to its
        # first pass, before the moment: start the walk (strictly before its start) past them.
        repeat = timedelta(0)
        if local.fold == 1:
            repeat = max(timedelta(0), _offset(wall, tz, 0) - _offset(wall, tz, 1))
        start = _floor_second(wall) + repeat + _SECOND
        for earlier in self._walk(start, reverse=True):
            tick = first_instant(earlier, tz)
            if tick <= moment:
                return tick
        return None

    def _walk(self, start: datetime, *, reverse: bool) -> Iterator[datetime]:
        # cronsim on naive datetimes does plain wall-clock arithmetic (no DST rules of its own);
        # it stops after 50 years without a match.
        yield from CronSim(self.expression, start, reverse=reverse)


def _offset(wall: datetime, tz: ZoneInfo, fold: int) -> timedelta:
    offset = wall.replace(tzinfo=tz, fold=fold).utcoffset()
    assert offset is not None  # a ZoneInfo always has one
    return offset


def _is_skipped(wall: datetime, tz: ZoneInfo) -> bool:
    aware = wall.replace(tzinfo=tz, fold=0)
    return aware.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != wall


def first_instant(wall: datetime, tz: ZoneInfo) -> datetime:
    """The instant a local wall time fires: its first occurrence, or for a time the clocks
    skip, the instant they jump (the next valid time)."""
    if not _is_skipped(wall, tz):
        return wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    # In a gap, fold=1 reads the wall time with the offset after the jump (an instant before
    # it) and fold=0 with the offset before (an instant after it): the jump lies between.
    before = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    after = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    offset = after.astimezone(tz).utcoffset()
    low, high = before, after  # low is before the jump, high at or after it
    while high - low > _SECOND:
        middle = _floor_second(low + (high - low) / 2)
        if middle <= low:
            middle = low + _SECOND
        if middle.astimezone(tz).utcoffset() == offset:
            high = middle
        else:
            low = middle
    return high
