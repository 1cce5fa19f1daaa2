"""Workspace facts on PostgreSQL: the active flag and budget holds, which the claim reads."""

from __future__ import annotations

from agentruns.adapters.postgres import sql
from agentruns.adapters.postgres.database import PostgresDatabase, execute, fetch
from agentruns.app.ports import BudgetHold, Transaction, WorkspaceStore
from agentruns.domain.budgets import Budget, BudgetState


class PostgresWorkspaceStore(WorkspaceStore):
    def __init__(self, database: PostgresDatabase) -> None:
        self._db = database

    async def set_active(self, tx: Transaction, workspace: str, active: bool) -> None:
        await execute(tx, sql.SET_ACTIVE, {"workspace": workspace, "active": active})

    async def hold_budget(self, tx: Transaction, hold: BudgetHold) -> None:
        await execute(
            tx,
            sql.HOLD_SPENT_BUDGET if hold.by_budget else sql.HOLD_BUDGET,
            {"workspace": hold.workspace, "until": hold.until, "reason": hold.reason},
        )

    async def budget(self, tx: Transaction, workspace: str) -> BudgetState | None:
        rows = await fetch(tx, sql.GET_BUDGET, {"workspace": workspace})
        if not rows:
            return None
        row = rows[0]
        return BudgetState(
            Budget(
                row["workspace"], row["tokens"], row["cost"], row["period"], row["rolling_window"]
            ),
            period_start=row["period_start"],
            spent_tokens=row["spent_tokens"],
            spent_cost=row["spent_cost"],
        )

    async def put_budget(self, tx: Transaction, state: BudgetState) -> None:
        budget = state.budget
        await execute(
            tx,
            sql.PUT_BUDGET,
            {
                "workspace": budget.workspace,
                "tokens": budget.tokens,
                "cost": budget.cost,
                "period": budget.period,
                "rolling_window": budget.rolling,
                "period_start": state.period_start,
                "spent_tokens": state.spent_tokens,
                "spent_cost": state.spent_cost,
                "hold_reason": state.reason,
            },
        )
        await execute(tx, sql.LIFT_BUDGET_HOLD, {"workspace": budget.workspace})

    async def remove_budget(self, tx: Transaction, workspace: str) -> bool:
        rows = await fetch(tx, sql.REMOVE_BUDGET, {"workspace": workspace})
        await execute(tx, sql.LIFT_BUDGET_HOLD, {"workspace": workspace})
        return bool(rows)

    async def release_budget(self, tx: Transaction, workspace: str) -> None:
        await execute(tx, sql.RELEASE_BUDGET, {"workspace": workspace})

    async def holds(self, tx: Transaction) -> list[BudgetHold]:
        rows = await fetch(tx, sql.HOLDS, {"now": self._db.now_param()})
        return [
            BudgetHold(
                workspace=row["workspace"],
                until=row["until"],
                reason=row["reason"],
                by_budget=row["by_budget"],
            )
            for row in rows
        ]
