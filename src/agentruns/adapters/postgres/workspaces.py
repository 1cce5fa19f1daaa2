"""Workspace facts on PostgreSQL: the active flag and budget holds, which the claim reads."""

from __future__ import annotations

from agentruns.adapters.postgres import sql
from agentruns.adapters.postgres.database import PostgresDatabase, execute, fetch
from agentruns.app.ports import BudgetHold, Transaction, WorkspaceStore


class PostgresWorkspaceStore(WorkspaceStore):
    def __init__(self, database: PostgresDatabase) -> None:
        self._db = database

    async def set_active(self, tx: Transaction, workspace: str, active: bool) -> None:
        await execute(tx, sql.SET_ACTIVE, {"workspace": workspace, "active": active})

    async def hold_budget(self, tx: Transaction, hold: BudgetHold) -> None:
        await execute(
            tx,
            sql.HOLD_BUDGET,
            {"workspace": hold.workspace, "until": hold.until, "reason": hold.reason},
        )

    async def release_budget(self, tx: Transaction, workspace: str) -> None:
        await execute(tx, sql.RELEASE_BUDGET, {"workspace": workspace})

    async def holds(self, tx: Transaction) -> list[BudgetHold]:
        rows = await fetch(tx, sql.HOLDS, {"now": self._db.now_param()})
        return [
            BudgetHold(workspace=row["workspace"], until=row["until"], reason=row["reason"])
            for row in rows
        ]
