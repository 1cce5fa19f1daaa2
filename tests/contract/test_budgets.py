"""Workspace budgets on every backend (ADRs/0033): a step's usage that reaches its workspace's
budget holds the workspace until the period turns or the budget is raised; a host's own hold
is never lifted by a budget."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from agentruns.app.ports import BudgetHold, RunEvent, StepWrite
from agentruns.app.runs import AgentRuns
from agentruns.domain.budgets import Budget, period_bounds
from agentruns.domain.errors import InvalidRequest
from agentruns.domain.run import AgentRun
from agentruns.domain.usage import Usage
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
