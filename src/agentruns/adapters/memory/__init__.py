"""In-memory adapters: small real implementations, shipped so hosts test without a database.

They keep the PostgreSQL adapters' semantics (the contract suite runs against both), with one
difference a test can rely on: transactions run one at a time.
"""

from __future__ import annotations

from agentruns.adapters.memory.database import MemoryDatabase, MemoryTable, MemoryTransaction
from agentruns.adapters.memory.notifier import MemoryNotifier
from agentruns.adapters.memory.reviews import MemoryReviewJobs
from agentruns.adapters.memory.runs import MemoryEventLog, MemoryRunStore
from agentruns.adapters.memory.sandbox_claims import MemorySandboxClaims
from agentruns.adapters.memory.sandboxes import MemorySandboxStore
from agentruns.adapters.memory.stats import MemoryRunStats
from agentruns.adapters.memory.workspaces import MemoryWorkspaceStore
from agentruns.app.ports import Clock, Stores
from agentruns.app.stats import RunStats


class MemoryFamily:
    """A fresh family of memory stores sharing one database and clock, with their concrete
    types (tests read ``family.runs.rows``; the app sees only :attr:`stores`)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.database = MemoryDatabase()
        self.notifier = MemoryNotifier()
        self.workspaces = MemoryWorkspaceStore(self.database, clock)
        self.runs = MemoryRunStore(self.database, clock, self.workspaces, self.notifier)
        self.events = MemoryEventLog(self.database, clock, self.runs)
        self.review_jobs = MemoryReviewJobs(self.database)
        self.sandboxes = MemorySandboxStore(self.database, clock, self.runs)
        self.stats = MemoryRunStats(self.database, self.runs, self.workspaces, clock)
        self.stores = Stores(
            scope=self.database,
            runs=self.runs,
            events=self.events,
            workspaces=self.workspaces,
            notifier=self.notifier,
        )


def make_memory_stores(clock: Clock) -> Stores:
    """The stores of a fresh memory family (what the container's memory profile uses)."""
    return MemoryFamily(clock).stores


def memory_run_stats(stores: Stores, clock: Clock) -> RunStats:
    """The read model over a family of memory stores (built by :func:`make_memory_stores`)."""
    if not isinstance(stores.scope, MemoryDatabase) or not isinstance(stores.runs, MemoryRunStore):
        raise TypeError("memory run stats need memory stores")
    if not isinstance(stores.workspaces, MemoryWorkspaceStore):
        raise TypeError("memory run stats need a memory workspace store")
    return MemoryRunStats(stores.scope, stores.runs, stores.workspaces, clock)


__all__ = [
    "MemoryDatabase",
    "MemoryEventLog",
    "MemoryFamily",
    "MemoryNotifier",
    "MemoryReviewJobs",
    "MemoryRunStats",
    "MemoryRunStore",
    "MemorySandboxClaims",
    "MemorySandboxStore",
    "MemoryTable",
    "MemoryTransaction",
    "MemoryWorkspaceStore",
    "make_memory_stores",
    "memory_run_stats",
]
