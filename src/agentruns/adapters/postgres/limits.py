"""Provider limits on PostgreSQL: statements from :mod:`~agentruns.adapters.postgres.limit_sql`,
the same answers as the memory store (the contract suite holds them together)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from agentruns.adapters.postgres import limit_sql as sql
from agentruns.adapters.postgres.database import PostgresDatabase, execute, fetch
from agentruns.app.ports import LimitStore, Transaction
from agentruns.domain import provider_limits as rule
from agentruns.domain.errors import UnknownLimit
from agentruns.domain.provider_limits import ProviderLimit, TakeAnswer


def _dimension(value: int | None, per_seconds: float) -> tuple[float, float]:
    if value is None:
        return 0.0, 0.0
    return rule.burst(value, per_seconds), rule.rate(value, per_seconds)


class PostgresLimitStore(LimitStore):
    def __init__(self, database: PostgresDatabase) -> None:
        self._db = database

    async def declare(self, tx: Transaction, limit: ProviderLimit) -> None:
        per = limit.per_seconds
        requests_burst, requests_rate = _dimension(limit.requests, per)
        tokens_burst, tokens_rate = _dimension(limit.tokens, per)
        await execute(
            tx,
            sql.DECLARE,
            {
                "now": self._db.now_param(),
                "name": limit.name,
                "requests": limit.requests,
                "tokens": limit.tokens,
                "per_seconds": per,
                "requests_burst": requests_burst,
                "requests_rate": requests_rate,
                "tokens_burst": tokens_burst,
                "tokens_rate": tokens_rate,
            },
        )

    async def take(self, tx: Transaction, name: str, requests: int, tokens: int) -> TakeAnswer:
        rule.check_take(requests, tokens)
        rows = await fetch(
            tx,
            sql.TAKE,
            {"now": self._db.now_param(), "name": name, "requests": requests, "tokens": tokens},
        )
        if not rows:
            raise UnknownLimit(name)
        wait = float(rows[0]["wait"])
        if wait > 0:
            return TakeAnswer(False, timedelta(seconds=wait))
        return TakeAnswer(True)

    async def pause(self, tx: Transaction, name: str, until: datetime) -> None:
        if not await fetch(tx, sql.PAUSE, {"name": name, "until": until}):
            raise UnknownLimit(name)

    async def empty(self, tx: Transaction, names: Sequence[str]) -> dict[str, timedelta]:
        rows = await fetch(
            tx, sql.EMPTY, {"now": self._db.now_param(), "names": sorted(set(names))}
        )
        return {row["name"]: timedelta(seconds=float(row["wait"])) for row in rows}

    async def all(self, tx: Transaction) -> list[ProviderLimit]:
        return [
            ProviderLimit(
                row["name"],
                requests=row["requests"],
                tokens=row["tokens"],
                per=timedelta(seconds=row["per_seconds"]),
            )
            for row in await fetch(tx, sql.ALL, {})
        ]
