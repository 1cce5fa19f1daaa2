"""Workspace facts in memory: the active flag and budget holds."""

from __future__ import annotations

from datetime import datetime

from agentruns.adapters.memory.database import MemoryDatabase, MemoryTable
from agentruns.app.ports import BudgetHold, Clock, Transaction, WorkspaceStore


class MemoryWorkspaceStore(WorkspaceStore):
    def __init__(self, database: MemoryDatabase, clock: Clock) -> None:
        self._database = database
        self._clock = clock
        self._inactive: MemoryTable[str, bool] = MemoryTable(database)
        self._holds: MemoryTable[str, BudgetHold] = MemoryTable(database)

    async def set_active(self, tx: Transaction, workspace: str, active: bool) -> None:
        if active:
            self._inactive.delete(tx, workspace)
        else:
            self._inactive.put(tx, workspace, True)

    async def hold_budget(self, tx: Transaction, hold: BudgetHold) -> None:
        self._holds.put(tx, hold.workspace, hold)

    async def release_budget(self, tx: Transaction, workspace: str) -> None:
        self._holds.delete(tx, workspace)

    async def holds(self, tx: Transaction) -> list[BudgetHold]:
        self._database.check(tx)
        return self.holds_at(self._clock.now())

    def holds_at(self, now: datetime) -> list[BudgetHold]:
        return sorted(
            (hold for hold in self._holds.values() if hold.until > now),
            key=lambda hold: hold.workspace,
        )

    def inactive(self) -> list[str]:
        return sorted(workspace for workspace, _ in self._inactive.items())

    def excluded_at(self, now: datetime) -> set[str]:
        """Workspaces whose runs are not offered now: inactive or under a hold."""
        return {workspace for workspace, _ in self._inactive.items()} | {
            hold.workspace for hold in self.holds_at(now)
        }
