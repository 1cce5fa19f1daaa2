"""The schedules and their ticks in memory: two tables keyed as PostgreSQL keys them.

Memory transactions run one at a time, so ``lock_due`` never finds a schedule held elsewhere
and ``lock_all`` needs no lock; the ticks table's key makes a second claim of a tick a no-op,
as the unique key does on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from agentruns.adapters.memory.database import MemoryDatabase, MemoryTable
from agentruns.app.ports import Clock, Transaction
from agentruns.app.schedule_ports import ScheduleStore, ScheduleTick
from agentruns.domain.ticks import ScheduleState


class MemoryScheduleStore(ScheduleStore):
    def __init__(self, database: MemoryDatabase, clock: Clock) -> None:
        self._database = database
        self._clock = clock
        self.rows: MemoryTable[str, ScheduleState] = MemoryTable(database)
        self.tick_rows: MemoryTable[tuple[str, datetime], ScheduleTick] = MemoryTable(database)

    async def lock_all(self, tx: Transaction) -> list[ScheduleState]:
        return await self.all(tx)

    async def all(self, tx: Transaction) -> list[ScheduleState]:
        self._database.check(tx)
        return sorted(self.rows.values(), key=lambda state: state.name)

    async def get(self, tx: Transaction, name: str, *, lock: bool = False) -> ScheduleState | None:
        self._database.check(tx)
        return self.rows.get(name)

    async def put(self, tx: Transaction, state: ScheduleState) -> None:
        self.rows.put(tx, state.name, state)

    def _due(self, kinds: Sequence[str]) -> list[ScheduleState]:
        now = self._clock.now()
        return [
            state
            for state in self.rows.values()
            if state.schedule.kind in kinds and state.is_due(now)
        ]

    async def due(self, tx: Transaction, kinds: Sequence[str], limit: int) -> list[str]:
        self._database.check(tx)
        found = sorted(self._due(kinds), key=lambda state: (state.next_tick_at, state.name))
        return [state.name for state in found[:limit]]

    async def lock_due(self, tx: Transaction, name: str) -> ScheduleState | None:
        self._database.check(tx)
        state = self.rows.get(name)
        return state if state is not None and state.is_due(self._clock.now()) else None

    async def next_due(self, tx: Transaction, kinds: Sequence[str]) -> datetime | None:
        self._database.check(tx)
        upcoming = [
            state.next_tick_at
            for state in self.rows.values()
            if state.schedule.kind in kinds and state.active and state.next_tick_at is not None
        ]
        return min(upcoming, default=None)

    async def claim_tick(self, tx: Transaction, name: str, tick_at: datetime) -> bool:
        self._database.check(tx)
        if self.tick_rows.get((name, tick_at)) is not None:
            return False
        self.tick_rows.put(
            tx, (name, tick_at), ScheduleTick(name, tick_at, None, self._clock.now())
        )
        return True

    async def record_tick(
        self, tx: Transaction, name: str, tick_at: datetime, run_id: UUID
    ) -> None:
        self._database.check(tx)
        claimed = self.tick_rows.get((name, tick_at))
        if claimed is None:
            raise LookupError(f"tick {tick_at} of schedule {name!r} was not claimed")
        self.tick_rows.put(
            tx, (name, tick_at), ScheduleTick(name, tick_at, run_id, claimed.enqueued_at)
        )

    async def ticks(self, tx: Transaction, name: str, limit: int) -> list[ScheduleTick]:
        self._database.check(tx)
        found = [tick for (schedule, _), tick in self.tick_rows.items() if schedule == name]
        found.sort(key=lambda tick: tick.tick_at, reverse=True)
        return found[:limit]

    async def prune_ticks(self, tx: Transaction, name: str, before: datetime) -> int:
        self._database.check(tx)
        old = [key for key, _ in self.tick_rows.items() if key[0] == name and key[1] < before]
        for key in old:
            self.tick_rows.delete(tx, key)
        return len(old)
