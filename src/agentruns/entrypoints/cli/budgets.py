"""``agentruns budget``: set, show and remove a workspace's budget (ADRs/0033)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from agentruns.app.runs import AgentRuns
from agentruns.domain.budgets import (
    BUDGET_PERIODS,
    Budget,
    BudgetPeriod,
    BudgetView,
    period_text,
    window_text,
)
from agentruns.domain.usage import cost_text
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.cli.root import DatabaseName, DataDir, app, out
from agentruns.entrypoints.cli.support import (
    CliError,
    database,
    duration,
    guarded,
    postgres_container,
    settings,
)
from agentruns.entrypoints.container import AgentRunsContainer

T = TypeVar("T")

budget_app = typer.Typer(
    help="Workspace budgets: tokens and cost per day, month or rolling window.",
    no_args_is_help=True,
)
app.add_typer(budget_app, name="budget")

Workspace = Annotated[str, typer.Argument(help="The workspace")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def _using(
    action: Callable[[AgentRuns], Awaitable[T]], data_dir: Path | None, name: str | None
) -> T:
    config = settings()
    with database(config, data_dir, name) as url:
        built: AgentRunsContainer = postgres_container(config, url)

        async def run() -> T:
            try:
                return await action(built.runs())
            finally:
                await composition.close(built)

        return asyncio.run(run())


def _cost(text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        return Decimal(text)
    except InvalidOperation:
        raise CliError(f"--cost must be a number, not {text!r}") from None


def _period(text: str) -> BudgetPeriod:
    for known in BUDGET_PERIODS:
        if text == known:
            return known
    raise CliError(f"--period must be one of {', '.join(BUDGET_PERIODS)}, not {text!r}")


def _window(text: str | None, period: BudgetPeriod) -> timedelta | None:
    if text is None:
        if period == "rolling":
            raise CliError("--period rolling needs --window (like 24h, 7d or 1h30m)")
        return None
    if period != "rolling":
        raise CliError(f"--window is for --period rolling, not {period}")
    return duration(text, "--window")


def fields(view: BudgetView) -> dict[str, object]:
    """A budget as plain JSON values (a rolling budget's period is its window up to now)."""
    state, budget = view.state, view.state.budget
    window = budget.rolling
    return {
        "workspace": budget.workspace,
        "tokens": budget.tokens,
        "cost": None if budget.cost is None else cost_text(budget.cost),
        "period": budget.period,
        "window": None if window is None else window_text(window),
        "period_start": state.period_start.isoformat(),
        "period_end": state.period_end.isoformat(),
        "spent_tokens": state.spent_tokens,
        "spent_cost": cost_text(state.spent_cost),
        "held_until": None if view.held_until is None else view.held_until.isoformat(),
    }


def text(view: BudgetView) -> str:
    """A budget in a few lines; a held workspace says why its runs wait."""
    state, budget = view.state, view.state.budget
    limits = []
    if budget.tokens is not None:
        limits.append(f"{state.spent_tokens} of {budget.tokens} tokens")
    if budget.cost is not None:
        limits.append(f"cost {cost_text(state.spent_cost)} of {cost_text(budget.cost)}")
    lines = [
        f"workspace {budget.workspace}: budget per {period_text(budget)}",
        f"  spent      {', '.join(limits)} since {state.period_start.isoformat(sep=' ')}",
    ]
    if budget.rolling is None:
        lines.append(f"  period end {state.period_end.isoformat(sep=' ')}")
    if view.held_until is not None:
        lines.append(f"  held: {state.reason} until {view.held_until.isoformat(sep=' ')}")
    return "\n".join(lines)


def _print(view: BudgetView, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps(fields(view)))
    else:
        out.print(text(view), markup=False, highlight=False)


@budget_app.command("set")
def budget_set(
    workspace: Workspace,
    tokens: Annotated[
        int | None, typer.Option(help="At most this many tokens (input and output) per period.")
    ] = None,
    cost: Annotated[str | None, typer.Option(help="At most this cost per period.")] = None,
    period: Annotated[
        str, typer.Option(help="day or month (UTC), or rolling (with --window).")
    ] = "day",
    window: Annotated[
        str | None,
        typer.Option(help="A rolling budget's window: 24h, 7d, 1h30m (at most 366 days)."),
    ] = None,
    as_json: AsJson = False,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Set the workspace's budget; its runs are held once a period's spend reaches it (a
    rolling window's: until enough of its spend ages out)."""

    def body() -> None:
        chosen = _period(period)
        budget = Budget(workspace, tokens, _cost(cost), chosen, _window(window, chosen))
        view = _using(lambda runs: runs.set_budget(budget), data_dir, database_name)
        _print(view, as_json)

    guarded(body)


@budget_app.command("show")
def budget_show(
    workspace: Workspace,
    as_json: AsJson = False,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Show the workspace's budget, this period's spend, and whether it holds the workspace."""

    def body() -> None:
        view = _using(lambda runs: runs.budget(workspace), data_dir, database_name)
        if view is None:
            raise CliError(f"workspace {workspace!r} has no budget")
        _print(view, as_json)

    guarded(body)


@budget_app.command("remove")
def budget_remove(
    workspace: Workspace,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Remove the workspace's budget and lift its budget's hold (a host's own hold stays)."""

    def body() -> None:
        if not _using(lambda runs: runs.remove_budget(workspace), data_dir, database_name):
            raise CliError(f"workspace {workspace!r} has no budget")
        out.print(f"budget of workspace {workspace} removed")

    guarded(body)
