"""A workspace's budget (ADRs/0033): at most so many tokens (input and output together), so much
cost, or both, per UTC day or month, or over a rolling window. Once the period's spend reaches a
limit, the workspace is held until the period ends, or, for a rolling window, until enough of
the window's spend has aged out of it (a hold in ``agent_budget_hold`` marked as the budget's,
so raising the budget lifts it and never a host's own hold).

The period rules here are pure functions of ``now``; the memory adapter uses them and the
PostgreSQL statements restate them (``date_trunc(period, at AT TIME ZONE 'UTC')``; for a rolling
window, the budget CTEs of the usage statements restate :func:`rolling_hold_until`), held
together by the contract suite (tests/contract/test_budgets.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Literal

from agentruns.domain.errors import InvalidRequest
from agentruns.domain.limits import MAX_BUDGET_WINDOW, duration, name, shown
from agentruns.domain.usage import Usage, UsageRecord, check_cost, check_tokens, cost_text

BudgetPeriod = Literal["day", "month", "rolling"]
BUDGET_PERIODS: tuple[BudgetPeriod, ...] = ("day", "month", "rolling")


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``tokens`` (input plus output) and/or ``cost`` per ``period`` (UTC day or month)
    for ``workspace``, or, with ``period="rolling"``, over any ``window`` (a timedelta longer
    than zero and at most :data:`~agentruns.domain.limits.MAX_BUDGET_WINDOW`; given only for a
    rolling budget, whose limits are above zero); checked when made."""

    workspace: str
    tokens: int | None = None
    cost: Decimal | None = None
    period: BudgetPeriod = "day"
    window: timedelta | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "workspace", name(self.workspace, "workspace"))
        object.__setattr__(self, "tokens", check_tokens(self.tokens, "a budget's tokens"))
        object.__setattr__(self, "cost", check_cost(self.cost))
        if self.tokens is None and self.cost is None:
            raise InvalidRequest("a budget limits tokens, cost or both: it names neither")
        if self.period not in BUDGET_PERIODS:
            raise InvalidRequest(
                f"a budget's period is one of {', '.join(BUDGET_PERIODS)}, not {shown(self.period)}"
            )
        if self.period != "rolling":
            if self.window is not None:
                raise InvalidRequest(
                    f"a budget's window is for a rolling budget only, not one per {self.period}"
                )
            return
        if self.window is None:
            raise InvalidRequest("a rolling budget needs its window (a timedelta)")
        duration(self.window, "a rolling budget's window", longest=MAX_BUDGET_WINDOW)
        if self.tokens == 0 or self.cost == 0:
            # A window's spend of zero would always reach it: there is no moment it ages out.
            raise InvalidRequest("a rolling budget's limits are above zero")

    @property
    def rolling(self) -> timedelta | None:
        """The window of a rolling budget; ``None`` for a day or month."""
        return self.window if self.period == "rolling" else None


def period_bounds(period: BudgetPeriod, now: datetime) -> tuple[datetime, datetime]:
    """The UTC day or month ``now`` falls in: its start and its end (the next one's start). A
    rolling window has no calendar bounds: see :func:`window_spend`."""
    if period == "rolling":
        raise ValueError("a rolling budget's window is not a calendar period")
    utc = now.astimezone(UTC)
    if period == "day":
        start = utc.replace(hour=0, minute=0, second=0, microsecond=0)
        return start, start + timedelta(days=1)
    start = utc.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if start.month == 12:
        return start, start.replace(year=start.year + 1, month=1)
    return start, start.replace(month=start.month + 1)


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget with its current period's start and what was spent in it."""

    budget: Budget
    period_start: datetime
    spent_tokens: int = 0
    spent_cost: Decimal = Decimal(0)

    @property
    def period_end(self) -> datetime:
        """The period's end; for a rolling window, the moment the state was read (its window is
        ``(period_start, period_end]``)."""
        window = self.budget.rolling
        if window is not None:
            return self.period_start + window
        return period_bounds(self.budget.period, self.period_start)[1]

    def at(self, now: datetime) -> BudgetState:
        """The state as of ``now``: a new period starts from nothing. A rolling window's state
        is read from the ledger (:func:`window_state`), so it is returned as it is."""
        if self.budget.rolling is not None:
            return self
        start, _ = period_bounds(self.budget.period, now)
        if start == self.period_start:
            return self
        return replace(self, period_start=start, spent_tokens=0, spent_cost=Decimal(0))

    def charged(self, usage: Usage, now: datetime) -> BudgetState:
        """The state after ``usage`` was spent at ``now``."""
        current = self.at(now)
        return replace(
            current,
            spent_tokens=current.spent_tokens
            + (usage.input_tokens or 0)
            + (usage.output_tokens or 0),
            spent_cost=current.spent_cost + (usage.cost or Decimal(0)),
        )

    @property
    def spent(self) -> bool:
        """A limit was reached in this period."""
        return _reached(self.budget, self.spent_tokens, self.spent_cost)

    @property
    def reason(self) -> str:
        """Why the workspace's runs wait (the hold's reason)."""
        return hold_reason(self.budget)


def hold_reason(budget: Budget) -> str:
    """A budget hold's reason: ``budget spent (1000 tokens per day)``; kept on the budget's row,
    so the statement that writes the hold writes this very text."""
    limits = []
    if budget.tokens is not None:
        limits.append(f"{budget.tokens} tokens")
    if budget.cost is not None:
        limits.append(f"cost {cost_text(budget.cost)}")
    return f"budget spent ({' or '.join(limits)} per {period_text(budget)})"


def period_text(budget: Budget) -> str:
    """What a budget is counted over, as shown: ``day``, ``month`` or ``rolling 1d``."""
    window = budget.rolling
    return budget.period if window is None else f"rolling {window_text(window)}"


def window_text(window: timedelta) -> str:
    """A window as the durations parser reads it back: ``1d``, ``12h``, ``1h30m``, ``1.5s``."""
    micros = (window.days * 86400 + window.seconds) * 1_000_000 + window.microseconds
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, micros = divmod(micros, size * 1_000_000)
        if count:
            parts.append(f"{count}{unit}")
    if micros:
        seconds = Decimal(micros) / 1_000_000
        parts.append(f"{seconds.normalize():f}s")
    return "".join(parts) or "0s"


def _spend(usage: Usage) -> tuple[int, Decimal]:
    return (usage.input_tokens or 0) + (usage.output_tokens or 0), usage.cost or Decimal(0)


def _reached(budget: Budget, tokens: int, cost: Decimal) -> bool:
    return (budget.tokens is not None and tokens >= budget.tokens) or (
        budget.cost is not None and cost >= budget.cost
    )


def _in_window(
    rows: Iterable[UsageRecord], window: timedelta, now: datetime
) -> list[tuple[datetime, int, Decimal]]:
    start = now - window
    return sorted((row.at, *_spend(row.usage)) for row in rows if start < row.at <= now)


def window_state(rows: Iterable[UsageRecord], budget: Budget, now: datetime) -> BudgetState:
    """A rolling budget's state at ``now``: the spend of the ledger ``rows`` at
    ``now - window < at <= now``, the window starting at ``now - window``."""
    window = budget.rolling
    if window is None:
        raise ValueError("window_state is for a rolling budget")
    spent = _in_window(rows, window, now)
    return BudgetState(
        budget,
        now - window,
        sum(tokens for _, tokens, _ in spent),
        sum((cost for _, _, cost in spent), Decimal(0)),
    )


def rolling_hold_until(
    rows: Iterable[UsageRecord], budget: Budget, now: datetime
) -> datetime | None:
    """Until when a rolling budget holds its workspace at ``now`` (``None``: its window's spend
    is below it): the earliest moment ``t`` at which the spend at ``t - window < at <= t`` of
    the rows already recorded (``at <= now``) is below the budget again. Rows only age out, so
    that is ``at + window`` of the row whose ageing out (with every row no later than it) leaves
    the rest below the budget. The usage statements' budget CTEs restate this rule
    (adapters/postgres/sql.py), held together by tests/contract/test_budgets.py."""
    window = budget.rolling
    if window is None:
        raise ValueError("rolling_hold_until is for a rolling budget")
    spent = _in_window(rows, window, now)
    tokens = sum(t for _, t, _ in spent)
    cost = sum((c for _, _, c in spent), Decimal(0))
    if not _reached(budget, tokens, cost):
        return None
    for index, (at, row_tokens, row_cost) in enumerate(spent):
        tokens, cost = tokens - row_tokens, cost - row_cost
        if index + 1 < len(spent) and spent[index + 1][0] == at:
            continue  # rows at the same moment age out together
        if not _reached(budget, tokens, cost):
            return at + window
    raise AssertionError("a rolling budget's limits are above zero")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class BudgetView:
    """A workspace's budget as the API answers it: the state as of now, and until when its
    workspace is held by it (``None``: not held)."""

    state: BudgetState
    held_until: datetime | None
