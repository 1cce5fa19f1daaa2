"""The adapter family port: every store a profile provides, chosen once at the composition root.

A family shares one connection scope (a PostgreSQL engine, or one memory database) among its
stores, so the run store, the sandbox store, the schedule store and the read model see the same
transactions.
"""

from __future__ import annotations

from typing import Protocol

from agentruns.app.ports import HolderStore, Stores
from agentruns.app.sandbox_ports import SandboxStore
from agentruns.app.schedule_ports import ScheduleStore
from agentruns.app.stats import RunStats


class AdapterFamily(Protocol):
    """The stores of one profile (memory or PostgreSQL) over one shared scope."""

    @property
    def stores(self) -> Stores: ...

    @property
    def sandboxes(self) -> SandboxStore: ...

    @property
    def stats(self) -> RunStats: ...

    @property
    def schedules(self) -> ScheduleStore: ...

    @property
    def holders(self) -> HolderStore: ...

    async def close(self) -> None:
        """Release what the family holds (a pool and a listening connection); idempotent."""
        ...
