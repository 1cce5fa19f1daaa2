"""Provider limits: named rate limits shared by every worker of one database (ADRs/0032).

A :class:`ProviderLimit` says how many requests and how many tokens a provider admits per
period (``openai/gpt-5``: 500 requests and 2,000,000 tokens a minute). Each dimension is a token
bucket: it holds at most :func:`burst` (one second's worth, at most half the limit) and refills
at ``(limit - burst) / (per * (1 + 1/60))``, so that no window of one period and a sixtieth
admits more than ``burst + rate * per * (1 + 1/60) = limit``: a take is made before its call, and
the call reaches the provider a little later; the sixtieth (a second of a minute) is the slack
that keeps a call delayed after its take (up to that long more than the one before it) inside
the provider's own window. A take of at most the burst is granted while the bucket holds
it; a larger take waits for a full bucket and may then leave it below zero, which bounds an
overshoot to one take.

These functions are the rule. The memory store applies them; the PostgreSQL store restates
them in one UPDATE (``adapters/postgres/limit_sql.py``), and the contract suite holds the two
together, as it does the claim order.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from agentruns.domain import limits
from agentruns.domain.errors import InvalidRequest

MAX_LIMIT = 10**15
SHORTEST_PERIOD = timedelta(seconds=1)
LONGEST_PERIOD = timedelta(days=1)
_BURST_WINDOW = 1.0  # seconds: a bucket holds one second's worth
# The refill spreads the rest of the limit over the period and a sixtieth more: the slack for a
# call that reaches the provider later after its take than the call before it did.
_SLACK = 1 / 60


@dataclass(frozen=True, slots=True)
class ProviderLimit:
    """``requests`` and ``tokens`` a provider admits per ``per`` (``None``: that dimension is
    not limited; at least one is). Its name is checked as every name is
    (:mod:`agentruns.domain.limits`)."""

    name: str
    requests: int | None = None
    tokens: int | None = None
    per: timedelta = timedelta(minutes=1)

    def __post_init__(self) -> None:
        limits.name(self.name, "a limit's name")
        for label, value in (("requests", self.requests), ("tokens", self.tokens)):
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidRequest(f"a limit's {label} is an integer")
            if not 1 <= value <= MAX_LIMIT:
                raise InvalidRequest(f"a limit's {label} is from 1 to {MAX_LIMIT}")
        if self.requests is None and self.tokens is None:
            raise InvalidRequest(f"limit {self.name!r} limits neither requests nor tokens")
        if not isinstance(self.per, timedelta):
            raise InvalidRequest("a limit's period is a timedelta")
        if not SHORTEST_PERIOD <= self.per <= LONGEST_PERIOD:
            raise InvalidRequest(f"a limit's period is from {SHORTEST_PERIOD} to {LONGEST_PERIOD}")

    @property
    def per_seconds(self) -> float:
        return self.per.total_seconds()


def burst(limit: int, per_seconds: float) -> float:
    """What one bucket holds when full: one second's worth, at most half the limit (so that it
    still refills)."""
    return limit * min(_BURST_WINDOW / per_seconds, 0.5)


def rate(limit: int, per_seconds: float) -> float:
    """What one bucket gains a second: the rest of the limit over the period and its slack."""
    return (limit - burst(limit, per_seconds)) / (per_seconds * (1 + _SLACK))


@dataclass(frozen=True, slots=True)
class LimitLevel:
    """A limit's buckets as stored: their levels at ``at``, and a pause (a provider's 429)."""

    requests: float
    tokens: float
    at: datetime
    paused_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class TakeAnswer:
    """A take's answer: granted, or how long until one like it can be (``wait``)."""

    granted: bool
    wait: timedelta = timedelta(0)


def full(limit: ProviderLimit, at: datetime) -> LimitLevel:
    """A newly declared limit: both buckets full."""
    return LimitLevel(_burst(limit.requests, limit), _burst(limit.tokens, limit), at)


def _burst(value: int | None, limit: ProviderLimit) -> float:
    return 0.0 if value is None else burst(value, limit.per_seconds)


def _level(value: int | None, level: float, elapsed: float, limit: ProviderLimit) -> float:
    if value is None:
        return 0.0
    return min(burst(value, limit.per_seconds), level + rate(value, limit.per_seconds) * elapsed)


def level_at(limit: ProviderLimit, level: LimitLevel, now: datetime) -> LimitLevel:
    """The buckets refilled to ``now`` (never emptied by a clock that stands before ``at``)."""
    elapsed = max(0.0, (now - level.at).total_seconds())
    return LimitLevel(
        _level(limit.requests, level.requests, elapsed, limit),
        _level(limit.tokens, level.tokens, elapsed, limit),
        max(now, level.at),
        level.paused_until,
    )


def redeclared(
    old: ProviderLimit, new: ProviderLimit, level: LimitLevel, now: datetime
) -> LimitLevel:
    """A changed definition keeps what its buckets hold now, at most the new bursts; a dimension
    it newly limits starts full."""
    current = level_at(old, level, now)
    return LimitLevel(
        _redeclared(old.requests, new.requests, current.requests, new),
        _redeclared(old.tokens, new.tokens, current.tokens, new),
        current.at,
        current.paused_until,
    )


def _redeclared(old: int | None, new: int | None, level: float, limit: ProviderLimit) -> float:
    if new is None:
        return 0.0
    top = burst(new, limit.per_seconds)
    return top if old is None else min(level, top)


def check_take(requests: int, tokens: int) -> None:
    """A take asks for whole, non-negative amounts, and for something."""
    for label, value in (("requests", requests), ("tokens", tokens)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidRequest(f"a take's {label} is an integer")
        if not 0 <= value <= MAX_LIMIT:
            raise InvalidRequest(f"a take's {label} is from 0 to {MAX_LIMIT}")
    if requests == 0 and tokens == 0:
        raise InvalidRequest("a take asks for at least one request or one token")


def _need(value: int | None, amount: int, limit: ProviderLimit) -> float:
    """What the bucket must hold to grant ``amount``: the amount, or a full bucket for a take
    larger than the burst."""
    if value is None or amount == 0:
        return -math.inf
    return min(float(amount), burst(value, limit.per_seconds))


def _wait(value: int | None, level: float, need: float, limit: ProviderLimit) -> float:
    if value is None or level >= need:
        return 0.0
    return (need - level) / rate(value, limit.per_seconds)


def take(
    limit: ProviderLimit, level: LimitLevel, requests: int, tokens: int, now: datetime
) -> tuple[TakeAnswer, LimitLevel]:
    """Take ``requests`` and ``tokens`` at ``now``: granted (both buckets lowered) only when
    the limit is not paused and each bucket holds what it needs; else the level refilled and
    how long until such a take can be granted."""
    check_take(requests, tokens)
    current = level_at(limit, level, now)
    need_r = _need(limit.requests, requests, limit)
    need_t = _need(limit.tokens, tokens, limit)
    pause = 0.0
    if current.paused_until is not None and current.paused_until > now:
        pause = (current.paused_until - now).total_seconds()
    wait = max(
        pause,
        _wait(limit.requests, current.requests, need_r, limit),
        _wait(limit.tokens, current.tokens, need_t, limit),
    )
    if wait > 0:
        return TakeAnswer(False, timedelta(seconds=wait)), current
    lowered = LimitLevel(
        current.requests - requests if limit.requests is not None else 0.0,
        current.tokens - tokens if limit.tokens is not None else 0.0,
        current.at,
        current.paused_until,
    )
    return TakeAnswer(True), lowered


def empty_for(limit: ProviderLimit, level: LimitLevel, now: datetime) -> timedelta | None:
    """How long until the limit could grant one request and one token (``None``: it can now):
    what a claim asks before it leases a run that draws from the limit."""
    answer, _ = take(
        limit,
        level,
        1 if limit.requests is not None else 0,
        1 if limit.tokens is not None else 0,
        now,
    )
    return None if answer.granted else answer.wait


def drawn_from(limited: Mapping[str, Sequence[str]]) -> list[str]:
    """Every limit name some kind of ``limited`` (kind -> limit names) draws from, sorted."""
    return sorted({name for names in limited.values() for name in names})


def with_room(
    kinds: Sequence[str], limited: Mapping[str, Sequence[str]], empty: Collection[str]
) -> list[str]:
    """Of ``kinds``, those a claim may lease now: every limit a kind draws from (``limited``:
    kind -> limit names) has room, that is, is not among ``empty``. A kind that draws from none
    always has room."""
    return [kind for kind in kinds if not any(name in empty for name in limited.get(kind, ()))]


def paused(level: LimitLevel, until: datetime) -> LimitLevel:
    """Paused until the later of its pause and ``until``."""
    current = level.paused_until
    later = until if current is None or until > current else current
    return LimitLevel(level.requests, level.tokens, level.at, later)


_UNITS = {
    "rpm": ("requests", 60),
    "rps": ("requests", 1),
    "tpm": ("tokens", 60),
    "tps": ("tokens", 1),
}


def parse_limits(text: str) -> tuple[ProviderLimit, ...]:
    """Limits as settings write them (``AGENTRUNS_LIMITS``): ``name=AMOUNTunit[,AMOUNTunit]``,
    limits separated by ``;``, units ``rpm``/``rps`` (requests a minute or a second) and
    ``tpm``/``tps`` (tokens); ``openai/gpt-5=500rpm,2000000tpm;local=10rps``. Both amounts of one
    limit share its period, so they name the same one (a minute or a second)."""
    found: list[ProviderLimit] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, sep, amounts = part.rpartition("=")
        if not sep or not name.strip():
            raise InvalidRequest(f"a limit is written name=500rpm,2000000tpm, not {part!r}")
        values: dict[str, int] = {}
        periods: set[int] = set()
        for amount in (a.strip().replace("_", "") for a in amounts.split(",")):
            unit = amount[-3:].lower()
            if unit not in _UNITS or not amount[:-3].isdigit():
                raise InvalidRequest(
                    f"limit {name.strip()!r}: {amount!r} is no amount (500rpm, 2000000tpm, 10rps)"
                )
            dimension, seconds = _UNITS[unit]
            if dimension in values:
                raise InvalidRequest(f"limit {name.strip()!r} names its {dimension} twice")
            values[dimension] = int(amount[:-3])
            periods.add(seconds)
        if len(periods) != 1:
            raise InvalidRequest(f"limit {name.strip()!r} mixes a minute and a second")
        found.append(ProviderLimit(name.strip(), per=timedelta(seconds=periods.pop()), **values))
    if len({limit.name for limit in found}) != len(found):
        raise InvalidRequest("a limit is named twice")
    return tuple(found)
