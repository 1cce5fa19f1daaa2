"""In-memory adapters: small real implementations, shipped so hosts test without a database.

They keep the PostgreSQL adapters' semantics (the contract suite runs against both), with one
difference a test can rely on: transactions run one at a time.
"""

from __future__ import annotations

from agentruns.adapters.memory.database import MemoryDatabase, MemoryTable, MemoryTransaction
from agentruns.adapters.memory.holders import MemoryHolderStore
from agentruns.adapters.memory.limits import MemoryLimitStore
from agentruns.adapters.memory.notifier import MemoryNotifier
from agentruns.adapters.memory.runs import MemoryEventLog, MemoryRunStore
from agentruns.adapters.memory.sandbox_claims import MemorySandboxClaims
from agentruns.adapters.memory.sandboxes import MemorySandboxStore
from agentruns.adapters.memory.schedules import MemoryScheduleStore
from agentruns.adapters.memory.stats import MemoryRunStats
from agentruns.adapters.memory.workspaces import MemoryWorkspaceStore
from agentruns.app.family import AdapterFamily
from agentruns.app.ports import Clock, Stores


class MemoryFamily(AdapterFamily):
    """A fresh family of memory stores sharing one database and clock, with their concrete
    types (tests read ``family.runs.rows``; the app sees only :attr:`stores`)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.database = MemoryDatabase()
        self.notifier = MemoryNotifier()
        self.workspaces = MemoryWorkspaceStore(self.database, clock)
        self.runs = MemoryRunStore(self.database, clock, self.workspaces, self.notifier)
        self.events = MemoryEventLog(self.database, clock, self.runs, self.workspaces)
        self._sandboxes = MemorySandboxStore(self.database, clock, self.runs)
        self._stats = MemoryRunStats(self.database, self.runs, self.workspaces, clock)
        self._schedules = MemoryScheduleStore(self.database, clock)
        self._holders = MemoryHolderStore(self.database, clock)
        self.limits = MemoryLimitStore(self.database, clock)
        self.runs.limits = self.limits
        self._stores = Stores(
            scope=self.database,
            runs=self.runs,
            events=self.events,
            workspaces=self.workspaces,
            notifier=self.notifier,
            limits=self.limits,
        )

    @property
    def stores(self) -> Stores:
        return self._stores

    @property
    def sandboxes(self) -> MemorySandboxStore:
        return self._sandboxes

    @property
    def stats(self) -> MemoryRunStats:
        return self._stats

    @property
    def schedules(self) -> MemoryScheduleStore:
        return self._schedules

    @property
    def holders(self) -> MemoryHolderStore:
        return self._holders

    async def close(self) -> None:
        """Nothing to release: the family lives as long as a reference to it."""


def make_memory_stores(clock: Clock) -> Stores:
    """The stores of a fresh memory family (what the container's memory profile uses)."""
    return MemoryFamily(clock).stores


__all__ = [
    "MemoryDatabase",
    "MemoryEventLog",
    "MemoryFamily",
    "MemoryHolderStore",
    "MemoryLimitStore",
    "MemoryNotifier",
    "MemoryRunStats",
    "MemoryRunStore",
    "MemorySandboxClaims",
    "MemorySandboxStore",
    "MemoryScheduleStore",
    "MemoryTable",
    "MemoryTransaction",
    "MemoryWorkspaceStore",
    "make_memory_stores",
]
