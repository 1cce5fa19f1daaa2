"""Bands of urgency, and aging: a run that waits long enough orders one band higher."""

from __future__ import annotations

import enum
from datetime import datetime, timedelta

from agentruns.domain.errors import InvalidBand


class Band(enum.IntEnum):
    """Lower orders first. A person waits on INTERACTIVE; BACKGROUND is scheduled work."""

    INTERACTIVE = 0
    BATCH = 1
    BACKGROUND = 2

    @classmethod
    def parse(cls, value: object) -> Band:
        """A band from its name (any case) or number; anything else is :class:`InvalidBand`."""
        if isinstance(value, Band):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        names = ", ".join(band.name.lower() for band in cls)
        raise InvalidBand(f"unknown band {value!r}: expected one of {names}")


DEFAULT_BAND_AGING = timedelta(minutes=10)


def aging_steps(due_at: datetime, now: datetime, aging: timedelta) -> int:
    """How many full ``aging`` periods a run has waited since it was due (0 before it is due)."""
    if aging <= timedelta(0):
        return 0
    waited = now - due_at
    if waited < aging:
        return 0
    return waited // aging


def effective_band(band: Band, due_at: datetime, now: datetime, aging: timedelta) -> Band:
    """The band a run orders in now: one higher per aging period, never into INTERACTIVE.

    An INTERACTIVE run stays INTERACTIVE; nothing else ever reaches it by waiting, so no
    scheduled work overtakes a person.
    """
    if band is Band.INTERACTIVE:
        return band
    return Band(max(int(band) - aging_steps(due_at, now, aging), int(Band.BATCH)))
