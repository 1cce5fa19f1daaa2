"""The port of the schedules table and its ticks.

A tick is a row keyed by (schedule, tick time). A scheduler claims the tick (an insert that is a
no-op if the row exists) and enqueues its run in the same transaction, so a tick is enqueued
once whoever races for it, and a crash before the commit leaves it unclaimed for the next pass
(ADRs/0015). Times are the store's own: the database clock, or the pinned test clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID

from agentruns.app.ports import Transaction
from agentruns.domain.ticks import ScheduleState


@dataclass(frozen=True, slots=True)
class ScheduleTick:
    """One claimed tick and the run it enqueued (``None`` until the run is recorded)."""

    schedule: str
    tick_at: datetime
    run_id: UUID | None
    enqueued_at: datetime


class ScheduleStore(Protocol):
    """The schedules table (definitions, operator state, the next tick) and the ticks table."""

    async def lock_all(self, tx: Transaction) -> list[ScheduleState]:
        """Every stored schedule, locked until the transaction ends (a pass ticking one is
        waited for; later passes skip it); concurrent callers (replicas syncing at start) wait
        for each other."""
        ...

    async def all(self, tx: Transaction) -> list[ScheduleState]:
        """Every stored schedule, removed ones too, by name."""
        ...

    async def get(self, tx: Transaction, name: str, *, lock: bool = False) -> ScheduleState | None:
        """One schedule; with ``lock``, held until the transaction ends."""
        ...

    async def put(self, tx: Transaction, state: ScheduleState) -> None:
        """Insert or replace the schedule's row."""
        ...

    async def due(self, tx: Transaction, kinds: Sequence[str], limit: int) -> list[str]:
        """Names of active schedules of ``kinds`` whose next tick is due now, earliest first."""
        ...

    async def lock_due(self, tx: Transaction, name: str) -> ScheduleState | None:
        """Lock the schedule if it is still due now; ``None`` if it is not, or if another
        transaction holds it (that replica is ticking it: skip it, do not wait)."""
        ...

    async def next_due(self, tx: Transaction, kinds: Sequence[str]) -> datetime | None:
        """The earliest next tick of the active schedules of ``kinds``."""
        ...

    async def claim_tick(self, tx: Transaction, name: str, tick_at: datetime) -> bool:
        """Claim the tick: False (nothing written) if it was claimed already. A claim another
        open transaction made is waited for: it counts if that transaction commits."""
        ...

    async def record_tick(
        self, tx: Transaction, name: str, tick_at: datetime, run_id: UUID
    ) -> None:
        """Record the run a tick claimed in this transaction enqueued."""
        ...

    async def ticks(self, tx: Transaction, name: str, limit: int) -> list[ScheduleTick]:
        """The schedule's claimed ticks, newest first."""
        ...

    async def prune_ticks(self, tx: Transaction, name: str, before: datetime) -> int:
        """Forget the schedule's ticks before ``before`` (no pass plans a tick that old)."""
        ...
