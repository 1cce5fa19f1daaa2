"""Provider limits in memory: the domain's token-bucket rule applied as written
(:mod:`agentruns.domain.provider_limits`), one row per limit."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from agentruns.adapters.memory.database import MemoryDatabase, MemoryTable
from agentruns.app.ports import Clock, LimitStore, Transaction
from agentruns.domain import provider_limits as rule
from agentruns.domain.errors import UnknownLimit
from agentruns.domain.provider_limits import LimitLevel, ProviderLimit, TakeAnswer


class MemoryLimitStore(LimitStore):
    def __init__(self, database: MemoryDatabase, clock: Clock) -> None:
        self._database = database
        self._clock = clock
        self.rows: MemoryTable[str, tuple[ProviderLimit, LimitLevel]] = MemoryTable(database)

    def _row(self, name: str) -> tuple[ProviderLimit, LimitLevel]:
        row = self.rows.get(name)
        if row is None:
            raise UnknownLimit(name)
        return row

    async def declare(self, tx: Transaction, limit: ProviderLimit) -> None:
        self._database.check(tx)
        now = self._clock.now()
        former = self.rows.get(limit.name)
        if former is None:
            level = rule.full(limit, now)
        else:
            level = rule.redeclared(former[0], limit, former[1], now)
        self.rows.put(tx, limit.name, (limit, level))

    async def take(self, tx: Transaction, name: str, requests: int, tokens: int) -> TakeAnswer:
        self._database.check(tx)
        limit, level = self._row(name)
        answer, level = rule.take(limit, level, requests, tokens, self._clock.now())
        self.rows.put(tx, name, (limit, level))
        return answer

    async def pause(self, tx: Transaction, name: str, until: datetime) -> None:
        self._database.check(tx)
        limit, level = self._row(name)
        self.rows.put(tx, name, (limit, rule.paused(level, until)))

    async def empty(self, tx: Transaction, names: Sequence[str]) -> dict[str, timedelta]:
        self._database.check(tx)
        now = self._clock.now()
        found: dict[str, timedelta] = {}
        for name in sorted(set(names)):
            row = self.rows.get(name)
            if row is not None and (wait := rule.empty_for(row[0], row[1], now)) is not None:
                found[name] = wait
        return found

    async def all(self, tx: Transaction) -> list[ProviderLimit]:
        self._database.check(tx)
        return sorted((limit for limit, _ in self.rows.values()), key=lambda limit: limit.name)
