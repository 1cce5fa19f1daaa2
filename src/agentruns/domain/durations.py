"""Durations as operators write them, parsed in one place for the command line and the settings.

``45`` (seconds), ``500ms``, ``45s``, ``30m``, ``12h``, ``7d``, ``2w``, sums of those (``1h30m``),
or ISO 8601 (``PT30S``, ``P7D``, ``P1DT12H``). Nothing negative, nothing longer than a century:
an amount no clock arithmetic can hold is refused here with one clear line, not later.
"""

from __future__ import annotations

import re
from datetime import timedelta

from agentruns.domain.errors import InvalidDuration

MAX_DURATION = timedelta(days=36_500)

_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)"
_SHORT = re.compile(rf"^(?:\s*{_PART})+\s*$")
_PARTS = re.compile(_PART)
_PLAIN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*$")
_ISO = re.compile(
    r"^P(?:(?P<w>\d+(?:\.\d+)?)W|(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?)$"
)
_EXAMPLES = "like 45s, 30m, 12h, 7d, 1h30m or PT30S"


def parse_duration(value: object) -> timedelta:
    """A :class:`timedelta` from a duration as text (or seconds as a number, or a timedelta);
    :class:`~agentruns.domain.errors.InvalidDuration` for anything else, negative, or longer
    than :data:`MAX_DURATION`."""
    seconds = _seconds(value)
    if seconds is None:
        raise InvalidDuration(f"{value!r} is not a duration {_EXAMPLES}")
    if seconds < 0:
        raise InvalidDuration(f"{value!r} is negative: a duration is 0 or more")
    if seconds > MAX_DURATION.total_seconds():
        raise InvalidDuration(f"{value!r} is longer than {MAX_DURATION.days} days")
    return timedelta(seconds=seconds)


def _seconds(value: object) -> float | None:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value == value else None  # NaN is no duration
    if not isinstance(value, str):
        return None
    text = value.strip()
    plain = _PLAIN.match(text)
    if plain:
        return float(plain[1])
    if _SHORT.match(text.lower()):
        return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _PARTS.findall(text.lower()))
    iso = _ISO.match(text.upper())
    if iso and text.upper() not in ("P", "PT") and not text.upper().endswith("T"):
        parts = {key: float(found) for key, found in iso.groupdict().items() if found}
        if parts:
            return (
                parts.get("w", 0) * 604800
                + parts.get("d", 0) * 86400
                + parts.get("h", 0) * 3600
                + parts.get("m", 0) * 60
                + parts.get("s", 0)
            )
    return None
