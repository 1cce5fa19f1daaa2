"""What a step spent (ADRs/0033): its input and output tokens, its cost, and the provider and
model it spent them with. Every field is optional; a step reports what it knows.

Cost is a :class:`~decimal.Decimal` (stored as ``numeric``): money is summed over many steps and
periods, and a binary float would drift from the provider's bill. Ints and floats are accepted
and turned into a Decimal (a float through its shortest repr, so ``0.1`` is ``Decimal("0.1")``).

A run's totals add its steps' usage (:meth:`Usage.plus`); the provider and model are the last
step's (a total spans providers: they are shown per step, in the ledger, and per period in a
workspace's spend). Periods of a spend are UTC hours, days and months (:func:`period_start`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Literal, TypeVar
from uuid import UUID

from agentruns.domain.errors import InvalidRequest
from agentruns.domain.limits import MAX_JSON_INTEGER, name, shown

# At most a trillion (currency units) per step or total, with at most 9 decimals: numeric holds
# it exactly, and no sum of a workspace's steps overflows an exact representation.
MAX_COST = Decimal(10) ** 15
COST_PLACES = 9

_N = TypeVar("_N", int, Decimal)

Per = Literal["hour", "day", "month"]
PERIODS: tuple[Per, ...] = ("hour", "day", "month")


def check_tokens(value: object, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequest(f"{what} must be an integer, not {shown(value)}")
    if not 0 <= value <= MAX_JSON_INTEGER:
        raise InvalidRequest(f"{what} must be from 0 to {MAX_JSON_INTEGER}, not {value}")
    return value


def check_cost(value: object) -> Decimal | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise InvalidRequest(f"cost must be a number (a Decimal), not {shown(value)}")
    try:
        cost = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    except InvalidOperation:
        raise InvalidRequest(f"cost must be a finite number, not {shown(value)}") from None
    if not cost.is_finite():
        raise InvalidRequest(f"cost must be a finite number, not {shown(value)}")
    if cost < 0 or cost >= MAX_COST:
        raise InvalidRequest(f"cost must be from 0 to below {MAX_COST}, not {cost}")
    exponent = cost.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -COST_PLACES:
        raise InvalidRequest(f"cost has more than {COST_PLACES} decimal places: {cost}")
    return cost


@dataclass(frozen=True, slots=True)
class Usage:
    """What one step spent (any field may be unknown: ``None``), checked when it is made."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: Decimal | None = None
    provider: str | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_tokens", check_tokens(self.input_tokens, "input_tokens"))
        object.__setattr__(self, "output_tokens", check_tokens(self.output_tokens, "output_tokens"))
        object.__setattr__(self, "cost", check_cost(self.cost))
        if self.provider is not None:
            object.__setattr__(self, "provider", name(self.provider, "provider"))
        if self.model is not None:
            object.__setattr__(self, "model", name(self.model, "model"))

    @property
    def empty(self) -> bool:
        """Nothing reported: no tokens, cost, provider or model."""
        return (
            self.input_tokens is None
            and self.output_tokens is None
            and self.cost is None
            and self.provider is None
            and self.model is None
        )

    def plus(self, other: Usage) -> Usage:
        """Both added up: unknown counts as nothing, the provider and model are ``other``'s
        where it names them. Refused past the limits of one usage (a total overflowing)."""
        return Usage(
            input_tokens=_add(self.input_tokens, other.input_tokens),
            output_tokens=_add(self.output_tokens, other.output_tokens),
            cost=_add(self.cost, other.cost),
            provider=other.provider if other.provider is not None else self.provider,
            model=other.model if other.model is not None else self.model,
        )

    def __add__(self, other: Usage) -> Usage:
        return self.plus(other)


def _add(left: _N | None, right: _N | None) -> _N | None:
    if left is None:
        return right
    if right is None:
        return left
    return left + right


def usage(value: object) -> Usage | None:
    """``None``, or a :class:`Usage` (checked when it was made); an empty one is ``None``."""
    if value is None:
        return None
    if not isinstance(value, Usage):
        raise InvalidRequest(f"usage must be an agentruns.Usage, not {shown(value)}")
    return None if value.empty else value


def per(value: object) -> Per:
    """A spend's period: ``"hour"``, ``"day"`` or ``"month"``."""
    for known in PERIODS:
        if value == known:
            return known
    raise InvalidRequest(f"per must be one of {', '.join(PERIODS)}, not {shown(value)}")


def period_start(at: datetime, per: Per) -> datetime:
    """The start of the UTC hour, day or month ``at`` falls in (the SQL restates it as
    ``date_trunc(per, at, 'UTC')``; the contract suite holds the two together)."""
    utc = at.astimezone(UTC)
    if per == "hour":
        return utc.replace(minute=0, second=0, microsecond=0)
    if per == "day":
        return utc.replace(hour=0, minute=0, second=0, microsecond=0)
    return utc.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True, slots=True)
class Spend:
    """A workspace's spend in one period, for one kind, provider and model: the steps that
    reported usage there and what they spent (unknown counts as nothing)."""

    period: datetime
    kind: str
    provider: str | None
    model: str | None
    steps: int
    input_tokens: int
    output_tokens: int
    cost: Decimal


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One step's usage as the ledger keeps it: a row per step that reported usage, kept past
    its run's purge (a workspace's spend outlives its runs)."""

    run_id: UUID
    seq: int
    workspace: str
    kind: str
    at: datetime
    usage: Usage


@dataclass(frozen=True, slots=True)
class WorkspaceSpend:
    """What one workspace's steps spent in a window (the console's spend per workspace)."""

    workspace: str
    steps: int
    input_tokens: int
    output_tokens: int
    cost: Decimal


def spend_by_workspace(
    records: list[UsageRecord], since: datetime, until: datetime
) -> list[WorkspaceSpend]:
    """The records at ``since <= at < until`` summed per workspace, most cost first (then most
    tokens, then by name): the memory adapter's; PostgreSQL sums and orders alike in SQL."""
    groups: dict[str, list[Usage]] = {}
    for record in records:
        if since <= record.at < until:
            groups.setdefault(record.workspace, []).append(record.usage)
    found = [
        WorkspaceSpend(
            workspace=workspace,
            steps=len(spent),
            input_tokens=sum(u.input_tokens or 0 for u in spent),
            output_tokens=sum(u.output_tokens or 0 for u in spent),
            cost=sum((u.cost or Decimal(0) for u in spent), Decimal(0)),
        )
        for workspace, spent in groups.items()
    ]
    found.sort(key=lambda s: (-s.cost, -(s.input_tokens + s.output_tokens), s.workspace))
    return found


def spend(records: list[UsageRecord], since: datetime, until: datetime, per: Per) -> list[Spend]:
    """The records at ``since <= at < until`` grouped by period, kind, provider and model, in
    that order (the memory adapter's spend; PostgreSQL groups alike in SQL)."""
    groups: dict[tuple[datetime, str, str | None, str | None], list[Usage]] = {}
    for record in records:
        if since <= record.at < until:
            key = (
                period_start(record.at, per),
                record.kind,
                record.usage.provider,
                record.usage.model,
            )
            groups.setdefault(key, []).append(record.usage)
    found: list[Spend] = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2] or "", k[3] or "")):
        spent = groups[key]
        found.append(
            Spend(
                period=key[0],
                kind=key[1],
                provider=key[2],
                model=key[3],
                steps=len(spent),
                input_tokens=sum(u.input_tokens or 0 for u in spent),
                output_tokens=sum(u.output_tokens or 0 for u in spent),
                cost=sum((u.cost or Decimal(0) for u in spent), Decimal(0)),
            )
        )
    return found


def cost_text(cost: Decimal) -> str:
    """A cost as plain text, without trailing zeros or an exponent: ``0.001``, ``12``."""
    text = format(cost.normalize(), "f")
    return "0" if text in ("-0", "") else text
