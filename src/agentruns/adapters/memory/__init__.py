"""In-memory adapters: small real implementations, shipped so hosts test without a database.

They keep the PostgreSQL adapters' semantics (the contract suite runs against both), with one
difference a test can rely on: transactions run one at a time.
"""

from __future__ import annotations

from agentruns.adapters.memory.database import MemoryDatabase, MemoryTable, MemoryTransaction
from agentruns.adapters.memory.notifier import MemoryNotifier
from agentruns.adapters.memory.runs import MemoryEventLog, MemoryRunStore
from agentruns.adapters.memory.stats import MemoryRunStats
from agentruns.adapters.memory.workspaces import MemoryWorkspaceStore
from agentruns.app.ports import Clock, Stores
from agentruns.app.stats import RunStats


def make_memory_stores(clock: Clock) -> Stores:
    """A fresh family of memory stores sharing one database and clock."""
    database = MemoryDatabase()
    notifier = MemoryNotifier()
    workspaces = MemoryWorkspaceStore(database, clock)
    runs = MemoryRunStore(database, clock, workspaces, notifier)
    events = MemoryEventLog(database, clock, runs)
    return Stores(
        scope=database, runs=runs, events=events, workspaces=workspaces, notifier=notifier
    )


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
    "MemoryNotifier",
    "MemoryRunStats",
    "MemoryRunStore",
    "MemoryTable",
    "MemoryTransaction",
    "MemoryWorkspaceStore",
    "make_memory_stores",
    "memory_run_stats",
]
