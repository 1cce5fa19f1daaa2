"""The holders' rows in memory: one table keyed by holder name, as PostgreSQL keys it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from agentruns.adapters.memory.database import MemoryDatabase, MemoryTable
from agentruns.app.ports import Clock, HolderStore, Transaction
from agentruns.domain.holders import Holder, HolderBeat


class MemoryHolderStore(HolderStore):
    def __init__(self, database: MemoryDatabase, clock: Clock) -> None:
        self._database = database
        self._clock = clock
        self.rows: MemoryTable[str, Holder] = MemoryTable(database)

    def _write(self, tx: Transaction, beat: HolderBeat, *, started: bool) -> Holder:
        self._database.check(tx)
        now = self._clock.now()
        former = None if started else self.rows.get(beat.holder)
        row = Holder(
            holder=beat.holder,
            process=beat.process,
            kinds=tuple(beat.kinds),
            renewal=beat.renewal,
            started_at=now if former is None else former.started_at,
            # Never before its start (a pinned clock may stand before a former start).
            seen_at=now if former is None else max(now, former.started_at),
        )
        self.rows.put(tx, beat.holder, row)
        return row

    async def started(self, tx: Transaction, beat: HolderBeat) -> Holder:
        return self._write(tx, beat, started=True)

    async def seen(self, tx: Transaction, beat: HolderBeat) -> Holder:
        return self._write(tx, beat, started=False)

    async def stopped(self, tx: Transaction, holder: str) -> None:
        self._database.check(tx)
        row = self.rows.get(holder)
        if row is not None:
            now = max(self._clock.now(), row.started_at)
            self.rows.put(tx, holder, replace(row, seen_at=now, stopped_at=now))

    async def all(self, tx: Transaction) -> list[Holder]:
        self._database.check(tx)
        return sorted(self.rows.values(), key=lambda row: row.holder)

    async def forget(self, tx: Transaction, older_than: timedelta) -> int:
        self._database.check(tx)
        before = self._clock.now() - older_than
        old = [name for name, row in self.rows.items() if row.seen_at < before]
        for name in old:
            self.rows.delete(tx, name)
        return len(old)
