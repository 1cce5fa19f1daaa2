"""Workspace budgets on every backend (ADRs/0033): a step's usage that reaches its workspace's
budget holds the workspace until the period turns (a rolling window: until enough of its spend
ages out) or the budget is raised; a host's own hold is never lifted by a budget."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import uuid4

import pytest

from agentruns.app.ports import BudgetHold, RunEvent, StepWrite
from agentruns.app.runs import AgentRuns
from agentruns.domain.budgets import Budget, period_bounds, rolling_hold_until, window_state
from agentruns.domain.errors import InvalidRequest
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import TerminationReason
from agentruns.domain.usage import Usage, UsageRecord
from tests.contract.conftest import START, Backend

TOMORROW = datetime(2026, 3, 2, tzinfo=UTC)


async def _holds(backend: Backend) -> list[BudgetHold]:
    async with backend.stores.scope.transaction() as tx:
        return await backend.stores.workspaces.holds(tx)


async def _leased(runs: AgentRuns, subject: str, workspace: str = "acme") -> AgentRun:
    await runs.enqueue("chat", workspace=workspace, subject=subject)
    [run] = await runs.claim("w")
    return run


async def test_a_budget_reached_holds_the_workspace_until_the_period_turns(
    backend: Backend, runs: AgentRuns
) -> None:
    view = await runs.set_budget(Budget("acme", tokens=100))
    assert (view.state.spent_tokens, view.held_until) == (0, None)
    run = await _leased(runs, "a")
    await runs.step_boundary(run.fence, "step", {}, usage=Usage(input_tokens=60))
    assert (await runs.budget("acme")).held_until is None  # type: ignore[union-attr]
    await runs.step_boundary(run.fence, "step", {}, usage=Usage(input_tokens=30, output_tokens=10))
    view = await runs.budget("acme")
    assert view is not None
    assert (view.state.spent_tokens, view.held_until) == (100, TOMORROW)
    [hold] = [h for h in await _holds(backend) if h.workspace == "acme"]
    assert (hold.by_budget, hold.reason) == (True, "budget spent (100 tokens per day)")
    # The run in flight goes on; its workspace's next runs are not offered, and a claim that
    # finds nothing spends no attempt.
    await runs.step_boundary(run.fence, "step", {})
    queued = await runs.enqueue("chat", workspace="acme", subject="b")
    await runs.enqueue("chat", workspace="other", subject="c")
    assert [r.workspace for r in await runs.claim("w", limit=5)] == ["other"]
    assert (await runs.get(queued.id)).attempt == 0
    # The day turns: the hold has lapsed, and the budget's spend starts again.
    backend.clock.set(TOMORROW + timedelta(minutes=1))
    assert [r.id for r in await runs.claim("w", limit=5)] == [queued.id]
    view = await runs.budget("acme")
    assert view is not None
    assert (view.state.spent_tokens, view.state.period_start, view.held_until) == (
        0,
        TOMORROW,
        None,
    )


async def test_raising_the_budget_lifts_its_hold_and_a_cost_budget_holds_by_cost(
    backend: Backend, runs: AgentRuns
) -> None:
    await runs.set_budget(Budget("acme", cost=Decimal("1.00"), period="month"))
    run = await _leased(runs, "a")
    [written] = await runs.settle_group(
        [StepWrite(run.fence, "step", {}, Usage(cost=Decimal("1.5"), input_tokens=1))]
    )
    assert isinstance(written, RunEvent)
    view = await runs.budget("acme")
    assert view is not None
    assert view.held_until == datetime(2026, 4, 1, tzinfo=UTC)
    assert view.state.spent_cost == Decimal("1.5")
    queued = await runs.enqueue("chat", workspace="acme", subject="b")
    assert await runs.claim("w") == []
    # Raised, but still spent: held again at once. Raised above the spend: free.
    still = await runs.set_budget(Budget("acme", cost=Decimal("1.5"), period="month"))
    assert still.held_until == datetime(2026, 4, 1, tzinfo=UTC)
    free = await runs.set_budget(Budget("acme", cost=2, period="month"))
    assert (free.state.spent_cost, free.held_until) == (Decimal("1.5"), None)
    assert [r.id for r in await runs.claim("w")] == [queued.id]


async def test_a_host_s_own_hold_is_kept_whatever_the_budget_does(
    backend: Backend, runs: AgentRuns
) -> None:
    until = START + timedelta(days=30)
    await runs.set_budget(Budget("acme", tokens=10))
    run = await _leased(runs, "a")
    await runs.hold_budget(BudgetHold("acme", until, "invoice unpaid"))
    await runs.step_boundary(run.fence, "step", {}, usage=Usage(input_tokens=50))
    await runs.set_budget(Budget("acme", tokens=1000))
    assert await runs.remove_budget("acme") is True
    assert await runs.remove_budget("acme") is False
    [hold] = [h for h in await _holds(backend) if h.workspace == "acme"]
    assert (hold.until, hold.reason, hold.by_budget) == (until, "invoice unpaid", False)
    assert await runs.budget("acme") is None


async def test_a_workspace_without_a_budget_is_never_held_and_a_removed_budget_frees(
    backend: Backend, runs: AgentRuns
) -> None:
    run = await _leased(runs, "a")
    await runs.step_boundary(run.fence, "step", {}, usage=Usage(input_tokens=10**9))
    assert await _holds(backend) == []
    await runs.set_budget(Budget("acme", tokens=5))
    assert (await runs.budget("acme")).held_until is not None  # type: ignore[union-attr]
    await runs.remove_budget("acme")
    assert await _holds(backend) == []


def test_bad_budgets_are_refused() -> None:
    for bad in (
        dict(workspace=""),
        dict(workspace="a"),
        dict(workspace="a", tokens=-1),
        dict(workspace="a", cost=float("inf")),
        dict(workspace="a", tokens=1, period="week"),
    ):
        with pytest.raises(InvalidRequest):
            Budget(**bad)  # type: ignore[arg-type]


async def test_set_budget_refuses_what_is_not_a_budget(runs: AgentRuns) -> None:
    with pytest.raises(InvalidRequest):
        await runs.set_budget({"workspace": "acme"})  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        await runs.remove_budget("")


def test_periods_are_utc_days_and_months() -> None:
    at = datetime(2026, 12, 31, 23, 30, tzinfo=UTC)
    assert period_bounds("day", at) == (
        datetime(2026, 12, 31, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    assert period_bounds("month", at) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )


async def test_a_zombie_holder_charges_no_budget(backend: Backend, runs: AgentRuns) -> None:
    await runs.set_budget(Budget("acme", tokens=10))
    await runs.enqueue("chat", workspace="acme", subject="stale")
    [first] = await runs.claim("old")
    await runs.requeue(first.fence, charged=False, delay=timedelta(0))
    [_second] = await runs.claim("new")
    [refused] = await runs.settle_group([StepWrite(first.fence, "s", {}, Usage(input_tokens=99))])
    assert not isinstance(refused, RunEvent)
    view = await runs.budget("acme")
    assert view is not None
    assert (view.state.spent_tokens, view.held_until) == (0, None)
    assert await _holds(backend) == []


HOUR = timedelta(hours=1)


async def _spend_once(runs: AgentRuns, subject: str, usage: Usage) -> None:
    """A run of acme claimed, one step that spent ``usage``, and its end."""
    run = await _leased(runs, subject)
    await runs.step_boundary(run.fence, "step", {}, usage=usage)
    await runs.end(run.fence, TerminationReason.COMPLETED)


async def test_a_rolling_budget_holds_until_enough_spend_ages_out_of_its_window(
    backend: Backend, runs: AgentRuns
) -> None:
    view = await runs.set_budget(Budget("acme", tokens=100, period="rolling", window=HOUR))
    assert (view.state.spent_tokens, view.held_until) == (0, None)
    await _spend_once(runs, "a", Usage(input_tokens=30))
    backend.clock.set(START + timedelta(minutes=10))
    await _spend_once(runs, "b", Usage(input_tokens=50, output_tokens=10))
    assert (await runs.budget("acme")).held_until is None  # type: ignore[union-attr]
    backend.clock.set(START + timedelta(minutes=20))
    await _spend_once(runs, "c", Usage(output_tokens=40))
    # 130 in the last hour: held. The 30 of START ageing out leaves 100 (still reached); the 60
    # of START + 10m ageing out leaves 40: held until START + 1h10m.
    released = START + timedelta(minutes=10) + HOUR
    view = await runs.budget("acme")
    assert view is not None
    assert (view.state.spent_tokens, view.held_until) == (130, released)
    [hold] = [h for h in await _holds(backend) if h.workspace == "acme"]
    assert (hold.until, hold.by_budget, hold.reason) == (
        released,
        True,
        "budget spent (100 tokens per rolling 1h)",
    )
    queued = await runs.enqueue("chat", workspace="acme", subject="d")
    await runs.enqueue("chat", workspace="other", subject="e")
    assert [r.workspace for r in await runs.claim("w", limit=5)] == ["other"]
    assert (await runs.get(queued.id)).attempt == 0
    # The first row aged out, but the window still holds 100: held.
    backend.clock.set(START + HOUR)
    view = await runs.budget("acme")
    assert view is not None
    assert (view.state.spent_tokens, view.held_until) == (100, released)
    backend.clock.set(released - timedelta(microseconds=1))
    assert await runs.claim("w", limit=5) == []
    # Enough aged out: free, with the 40 of START + 20m still in the window.
    backend.clock.set(released)
    assert [r.id for r in await runs.claim("w", limit=5)] == [queued.id]
    view = await runs.budget("acme")
    assert view is not None
    assert (view.state.spent_tokens, view.state.period_start, view.held_until) == (
        40,
        released - HOUR,
        None,
    )


async def test_a_rolling_budget_raised_frees_and_a_group_reaching_it_holds_by_cost(
    backend: Backend, runs: AgentRuns
) -> None:
    budget = Budget("acme", cost=Decimal("1.00"), period="rolling", window=timedelta(days=1))
    await runs.set_budget(budget)
    await runs.enqueue("chat", workspace="acme", subject="a")
    await runs.enqueue("chat", workspace="acme", subject="b")
    first, second = await runs.claim("w", limit=2)
    written = await runs.settle_group(
        [
            StepWrite(first.fence, "step", {}, Usage(cost=Decimal("0.6"))),
            StepWrite(second.fence, "step", {}, Usage(cost=Decimal("0.5"), input_tokens=3)),
        ]
    )
    assert all(isinstance(w, RunEvent) for w in written)
    day = START + timedelta(days=1)
    view = await runs.budget("acme")
    assert view is not None
    assert (view.state.spent_cost, view.held_until) == (Decimal("1.1"), day)
    queued = await runs.enqueue("chat", workspace="acme", subject="c")
    assert await runs.claim("w") == []
    # Raised but still reached: held again at once, from the ledger. Raised above: free.
    still = await runs.set_budget(
        Budget("acme", cost=Decimal("1.1"), period="rolling", window=timedelta(days=1))
    )
    assert still.held_until == day
    free = await runs.set_budget(Budget("acme", cost=2, period="rolling", window=HOUR))
    assert (free.state.spent_cost, free.held_until) == (Decimal("1.1"), None)
    assert [r.id for r in await runs.claim("w")] == [queued.id]
    # A smaller window set later, once the spend aged out of it, starts from nothing.
    backend.clock.set(START + 2 * HOUR)
    view = await runs.set_budget(Budget("acme", cost=1, period="rolling", window=HOUR))
    assert (view.state.spent_cost, view.held_until) == (Decimal(0), None)


async def test_removing_a_rolling_budget_frees_and_a_host_s_hold_stays(
    backend: Backend, runs: AgentRuns
) -> None:
    await runs.set_budget(Budget("acme", tokens=10, period="rolling", window=HOUR))
    await _spend_once(runs, "a", Usage(input_tokens=10))
    assert (await runs.budget("acme")).held_until == START + HOUR  # type: ignore[union-attr]
    assert await runs.remove_budget("acme") is True
    assert await _holds(backend) == []
    until = START + timedelta(days=30)
    await runs.hold_budget(BudgetHold("acme", until, "invoice unpaid"))
    await runs.set_budget(Budget("acme", tokens=10, period="rolling", window=HOUR))
    [hold] = await _holds(backend)
    assert (hold.until, hold.reason, hold.by_budget) == (until, "invoice unpaid", False)


def test_bad_rolling_budgets_are_refused() -> None:
    for bad in (
        dict(workspace="a", tokens=1, period="rolling"),
        dict(workspace="a", tokens=1, period="rolling", window=timedelta(0)),
        dict(workspace="a", tokens=1, period="rolling", window=-HOUR),
        dict(workspace="a", tokens=1, period="rolling", window=timedelta(days=367)),
        dict(workspace="a", tokens=1, period="rolling", window=3600),
        dict(workspace="a", tokens=0, period="rolling", window=HOUR),
        dict(workspace="a", cost=0, tokens=5, period="rolling", window=HOUR),
        dict(workspace="a", tokens=1, period="day", window=HOUR),
        dict(workspace="a", tokens=1, period="month", window=HOUR),
    ):
        with pytest.raises(InvalidRequest):
            Budget(**bad)  # type: ignore[arg-type]


def test_a_rolling_hold_lasts_until_rows_at_one_moment_age_out_together() -> None:
    budget = Budget("a", tokens=10, cost=Decimal(5), period="rolling", window=HOUR)

    def row(minute: int, tokens: int, cost: str = "0") -> UsageRecord:
        at = START + timedelta(minutes=minute)
        return UsageRecord(
            uuid4(), 1, "a", "chat", at, Usage(input_tokens=tokens, cost=Decimal(cost))
        )

    now = START + timedelta(minutes=30)
    rows = [row(-90, 50), row(0, 4), row(0, 4), row(10, 5), row(30, 1)]
    # The row of -90m is out of the window; 14 tokens reached; the two rows of START age out
    # together, leaving 6 < 10.
    assert rolling_hold_until(rows, budget, now) == START + HOUR
    assert rolling_hold_until(rows[:3], budget, now) is None
    # Cost reached as well: held until both are below.
    rows.append(row(20, 0, "6"))
    assert rolling_hold_until(rows, budget, now) == START + timedelta(minutes=20) + HOUR
    assert window_state(rows, budget, now).spent_tokens == 14
