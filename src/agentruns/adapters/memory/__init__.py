"""In-memory adapters: small real implementations, shipped so hosts test without a database.

They keep the PostgreSQL adapters' semantics (the contract suite runs against both), with one
difference a test can rely on: transactions run one at a time.
"""

from __future__ import annotations

from agentruns.adapters.memory.database import MemoryDatabase, MemoryTable, MemoryTransaction
from agentruns.adapters.memory.notifier import MemoryNotifier
from agentruns.adapters.memory.runs import MemoryEventLog, MemoryRunStore
from agentruns.adapters.memory.workspaces import MemoryWorkspaceStore
from agentruns.app.ports import Clock, Stores


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


__all__ = [
    "MemoryDatabase",
    "MemoryEventLog",
    "MemoryNotifier",
    "MemoryRunStore",
    "MemoryTable",
    "MemoryTransaction",
    "MemoryWorkspaceStore",
    "make_memory_stores",
]
