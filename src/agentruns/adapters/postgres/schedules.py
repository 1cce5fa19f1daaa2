"""The schedules table and its ticks on PostgreSQL: statements from
:mod:`~agentruns.adapters.postgres.schedule_sql`, the same answers as the memory store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from agentruns.adapters.postgres import schedule_sql as sql
from agentruns.adapters.postgres.database import PostgresDatabase, Row, execute, fetch
from agentruns.app.ports import Transaction
from agentruns.app.schedule_ports import ScheduleStore, ScheduleTick
from agentruns.domain.bands import Band
from agentruns.domain.schedule import Schedule
from agentruns.domain.ticks import ScheduleState


def state_from_row(row: Row) -> ScheduleState:
    schedule = Schedule(
        name=row["name"],
        kind=row["kind"],
        workspace=row["workspace"],
        subject=row["subject"],
        cron=row["cron"],
        every=row["every"],
        timezone=row["timezone"],
        band=Band(row["band"]),
        payload=row["payload"],
        catch_up=row["catch_up"],
        catch_up_limit=row["catch_up_limit"],
        grace=row["grace"],
    )
    return ScheduleState(
        schedule=schedule,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        next_tick_at=row["next_tick_at"],
        paused=row["paused"],
        removed_at=row["removed_at"],
        last_tick_at=row["last_tick_at"],
        last_run=row["last_run"],
    )


def _row_params(state: ScheduleState) -> dict[str, Any]:
    schedule = state.schedule
    return {
        "name": schedule.name,
        "kind": schedule.kind,
        "workspace": schedule.workspace,
        "subject": schedule.subject,
        "band": int(schedule.band),
        "payload": schedule.payload,
        "cron": schedule.cron,
        "every": schedule.every,
        "timezone": schedule.timezone,
        "catch_up": schedule.catch_up.value,
        "catch_up_limit": schedule.catch_up_limit,
        "grace": schedule.grace,
        "paused": state.paused,
        "next_tick_at": state.next_tick_at,
        "last_tick_at": state.last_tick_at,
        "last_run": state.last_run,
        "created_at": state.created_at,
        "updated_at": state.updated_at,
        "removed_at": state.removed_at,
    }


class PostgresScheduleStore(ScheduleStore):
    def __init__(self, database: PostgresDatabase) -> None:
        self._db = database

    def _params(self, **params: Any) -> Mapping[str, Any]:
        return {"now": self._db.now_param(), **params}

    async def lock_all(self, tx: Transaction) -> list[ScheduleState]:
        await fetch(tx, sql.LOCK_SYNC, {})
        return [state_from_row(row) for row in await fetch(tx, sql.LIST_LOCKED, {})]

    async def all(self, tx: Transaction) -> list[ScheduleState]:
        return [state_from_row(row) for row in await fetch(tx, sql.LIST, {})]

    async def get(self, tx: Transaction, name: str, *, lock: bool = False) -> ScheduleState | None:
        rows = await fetch(tx, sql.GET_LOCKED if lock else sql.GET, {"name": name})
        return state_from_row(rows[0]) if rows else None

    async def put(self, tx: Transaction, state: ScheduleState) -> None:
        await execute(tx, sql.PUT, _row_params(state))

    async def due(self, tx: Transaction, kinds: Sequence[str], limit: int) -> list[str]:
        rows = await fetch(tx, sql.DUE, self._params(kinds=list(kinds), limit=limit))
        return [row["name"] for row in rows]

    async def lock_due(self, tx: Transaction, name: str) -> ScheduleState | None:
        rows = await fetch(tx, sql.LOCK_DUE, self._params(name=name))
        return state_from_row(rows[0]) if rows else None

    async def next_due(self, tx: Transaction, kinds: Sequence[str]) -> datetime | None:
        rows = await fetch(tx, sql.NEXT_DUE, {"kinds": list(kinds)})
        found: datetime | None = rows[0]["next_tick_at"]
        return found

    async def claim_tick(self, tx: Transaction, name: str, tick_at: datetime) -> bool:
        rows = await fetch(tx, sql.CLAIM_TICK, self._params(name=name, tick_at=tick_at))
        return bool(rows)

    async def record_tick(
        self, tx: Transaction, name: str, tick_at: datetime, run_id: UUID
    ) -> None:
        touched = await execute(
            tx, sql.RECORD_TICK, {"name": name, "tick_at": tick_at, "run_id": run_id}
        )
        if touched != 1:
            raise LookupError(f"tick {tick_at} of schedule {name!r} was not claimed")

    async def ticks(self, tx: Transaction, name: str, limit: int) -> list[ScheduleTick]:
        rows = await fetch(tx, sql.TICKS, {"name": name, "limit": limit})
        return [
            ScheduleTick(row["schedule"], row["tick_at"], row["run_id"], row["enqueued_at"])
            for row in rows
        ]

    async def prune_ticks(self, tx: Transaction, name: str, before: datetime) -> int:
        return await execute(tx, sql.PRUNE_TICKS, {"name": name, "before": before})
