"""A workspace's budget (ADRs/0033): at most so many tokens (input and output together), so much
cost, or both, per UTC day or month. Once the period's spend reaches a limit, the workspace is
held until the period ends (a hold in ``agent_budget_hold`` marked as the budget's, so raising
the budget lifts it and never a host's own hold).

The period rules here are pure functions of ``now``; the memory adapter uses them and the
PostgreSQL statements restate them (``date_trunc(period, at AT TIME ZONE 'UTC')``), held
together by the contract suite (tests/contract/test_budgets.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Literal

from agentruns.domain.errors import InvalidRequest
from agentruns.domain.limits import name, shown
from agentruns.domain.usage import Usage, check_cost, check_tokens, cost_text

BudgetPeriod = Literal["day", "month"]
BUDGET_PERIODS: tuple[BudgetPeriod, ...] = ("day", "month")


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``tokens`` (input plus output) and/or ``cost`` per ``period`` (UTC day or month)
    for ``workspace``; checked when made."""

    workspace: str
    tokens: int | None = None
    cost: Decimal | None = None
    period: BudgetPeriod = "day"

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


def period_bounds(period: BudgetPeriod, now: datetime) -> tuple[datetime, datetime]:
    """The UTC day or month ``now`` falls in: its start and its end (the next one's start)."""
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
        return period_bounds(self.budget.period, self.period_start)[1]

    def at(self, now: datetime) -> BudgetState:
        """The state as of ``now``: a new period starts from nothing."""
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
        budget = self.budget
        return (budget.tokens is not None and self.spent_tokens >= budget.tokens) or (
            budget.cost is not None and self.spent_cost >= budget.cost
        )

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
    return f"budget spent ({' or '.join(limits)} per {budget.period})"


@dataclass(frozen=True, slots=True)
class BudgetView:
    """A workspace's budget as the API answers it: the state as of now, and until when its
    workspace is held by it (``None``: not held)."""

    state: BudgetState
    held_until: datetime | None
