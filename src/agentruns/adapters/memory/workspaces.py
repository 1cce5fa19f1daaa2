"""Workspace facts in memory: the active flag and budget holds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from agentruns.adapters.memory.database import MemoryDatabase, MemoryTable
from agentruns.app.ports import BudgetHold, Clock, Transaction, WorkspaceStore
from agentruns.domain.budgets import BudgetState, hold_reason, rolling_hold_until
from agentruns.domain.usage import Usage, UsageRecord


class MemoryWorkspaceStore(WorkspaceStore):
    def __init__(self, database: MemoryDatabase, clock: Clock) -> None:
        self._database = database
        self._clock = clock
        self._inactive: MemoryTable[str, bool] = MemoryTable(database)
        self._holds: MemoryTable[str, BudgetHold] = MemoryTable(database)
        self._budgets: MemoryTable[str, BudgetState] = MemoryTable(database)

    async def set_active(self, tx: Transaction, workspace: str, active: bool) -> None:
        if active:
            self._inactive.delete(tx, workspace)
        else:
            self._inactive.put(tx, workspace, True)

    async def hold_budget(self, tx: Transaction, hold: BudgetHold) -> None:
        if hold.by_budget:
            existing = self._holds.get(hold.workspace)
            if existing is not None and not existing.by_budget:
                return  # a host's own hold is never replaced by a budget's
        self._holds.put(tx, hold.workspace, hold)

    async def budget(self, tx: Transaction, workspace: str) -> BudgetState | None:
        self._database.check(tx)
        return self._budgets.get(workspace)

    async def put_budget(self, tx: Transaction, state: BudgetState) -> None:
        self._database.check(tx)
        self._budgets.put(tx, state.budget.workspace, state)
        self._lift(tx, state.budget.workspace)

    async def remove_budget(self, tx: Transaction, workspace: str) -> bool:
        self._database.check(tx)
        had = self._budgets.get(workspace) is not None
        self._budgets.delete(tx, workspace)
        self._lift(tx, workspace)
        return had

    def _lift(self, tx: Transaction, workspace: str) -> None:
        hold = self._holds.get(workspace)
        if hold is not None and hold.by_budget:
            self._holds.delete(tx, workspace)

    def charge(
        self,
        tx: Transaction,
        workspace: str,
        usage: Usage,
        at: datetime,
        ledger: Callable[[], Sequence[UsageRecord]],
    ) -> None:
        """A step's usage charged to the workspace's budget, if it has one, in the step's own
        write (ADRs/0033); a budget spent holds the workspace until its period ends. A rolling
        budget reads its window from ``ledger()`` (the workspace's rows, this step's included) and
        holds the workspace until enough of that spend ages out
        (:func:`~agentruns.domain.budgets.rolling_hold_until`)."""
        state = self._budgets.get(workspace)
        if state is None:
            return
        if state.budget.rolling is not None:
            until = rolling_hold_until(ledger(), state.budget, at)
            if until is not None:
                self._hold(tx, BudgetHold(workspace, until, hold_reason(state.budget), True))
            return
        charged = state.charged(usage, at)
        self._budgets.put(tx, workspace, charged)
        if charged.spent:
            self._hold_spent(tx, charged)

    def _hold_spent(self, tx: Transaction, state: BudgetState) -> None:
        hold = BudgetHold(state.budget.workspace, state.period_end, state.reason, by_budget=True)
        self._hold(tx, hold)

    def _hold(self, tx: Transaction, hold: BudgetHold) -> None:
        existing = self._holds.get(hold.workspace)
        if existing is not None and not existing.by_budget:
            return
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
