"""The holders' rows on PostgreSQL: statements from
:mod:`~agentruns.adapters.postgres.holder_sql`, the same answers as the memory store."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from agentruns.adapters.postgres import holder_sql as sql
from agentruns.adapters.postgres.database import PostgresDatabase, Row, execute, fetch
from agentruns.app.ports import HolderStore, Transaction
from agentruns.domain.holders import Holder, HolderBeat


def holder_from_row(row: Row) -> Holder:
    return Holder(
        holder=row["holder"],
        process=row["process"],
        kinds=tuple(row["kinds"]),
        renewal=row["renewal"],
        started_at=row["started_at"],
        seen_at=row["seen_at"],
        stopped_at=row["stopped_at"],
    )


class PostgresHolderStore(HolderStore):
    def __init__(self, database: PostgresDatabase) -> None:
        self._db = database

    def _params(self, **params: Any) -> Mapping[str, Any]:
        return {"now": self._db.now_param(), **params}

    def _beat(self, beat: HolderBeat) -> Mapping[str, Any]:
        return self._params(
            holder=beat.holder, process=beat.process, kinds=list(beat.kinds), renewal=beat.renewal
        )

    async def started(self, tx: Transaction, beat: HolderBeat) -> Holder:
        [row] = await fetch(tx, sql.STARTED, self._beat(beat))
        return holder_from_row(row)

    async def seen(self, tx: Transaction, beat: HolderBeat) -> Holder:
        [row] = await fetch(tx, sql.SEEN, self._beat(beat))
        return holder_from_row(row)

    async def stopped(self, tx: Transaction, holder: str) -> None:
        await execute(tx, sql.STOPPED, self._params(holder=holder))

    async def all(self, tx: Transaction) -> list[Holder]:
        return [holder_from_row(row) for row in await fetch(tx, sql.ALL, {})]

    async def forget(self, tx: Transaction, older_than: timedelta) -> int:
        return await execute(tx, sql.FORGET, self._params(older_than=older_than))
