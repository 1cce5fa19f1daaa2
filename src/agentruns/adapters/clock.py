"""Clocks: the system clock for production, a manual clock that tests move by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agentruns.app.ports import Clock


class SystemClock(Clock):
    """The machine's clock, in UTC. (PostgreSQL stores prefer the database clock instead.)"""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock(Clock):
    """A clock that stands still until a test moves it."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("a manual clock needs an aware datetime")

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        if delta < timedelta(0):
            raise ValueError("a clock does not go back")
        self._now += delta
        return self._now

    def set(self, moment: datetime) -> None:
        if moment.tzinfo is None:
            raise ValueError("a manual clock needs an aware datetime")
        if moment < self._now:
            raise ValueError("a clock does not go back")
        self._now = moment
