"""``AgentSchedules``: the declared schedules synced to the table, and what operators do to them.

The schedules live in code with the kinds (``RunKinds(kinds, schedules=[...])``). On start a
process that runs the scheduler syncs them to the table, so operators can see them: added,
changed and removed ones are written and reported (and logged), under a lock that makes
replicas starting together sync one after another. ``pause`` and ``resume`` are operator state
the sync keeps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from agentruns.app.ports import Transaction
from agentruns.app.runs import AgentRuns
from agentruns.app.schedule_ports import ScheduleStore, ScheduleTick
from agentruns.domain import ticks
from agentruns.domain.errors import ScheduleNotFound
from agentruns.domain.ticks import ScheduleState

log = logging.getLogger("agentruns.schedules")


@dataclass(frozen=True, slots=True)
class SyncReport:
    """Names of the schedules a sync added (or added back), changed, marked removed, or left."""

    added: list[str]
    changed: list[str]
    removed: list[str]
    unchanged: list[str]


class AgentSchedules:
    def __init__(self, runs: AgentRuns, store: ScheduleStore) -> None:
        self._runs = runs
        self._store = store

    async def _now(self, tx: Transaction) -> datetime:
        return await self._runs.stores.runs.now(tx)

    async def sync(self) -> SyncReport:
        """Write the declared schedules of this process's kinds to the table. A stored
        schedule of one of these kinds that is no longer declared is marked removed; those of
        kinds this process does not register are left to the processes that do."""
        kinds = self._runs.kinds
        async with self._runs.transaction() as tx:
            stored = await self._store.lock_all(tx)
            now = await self._now(tx)
            plan = ticks.reconcile(kinds.schedules, stored, kinds.names(), now)
            for state in plan.writes:
                await self._store.put(tx, state)
        report = SyncReport(
            added=[state.name for state in plan.added],
            changed=[state.name for state in plan.changed],
            removed=[state.name for state in plan.removed],
            unchanged=plan.unchanged,
        )
        for what, names in (
            ("added", report.added),
            ("changed", report.changed),
            ("removed", report.removed),
        ):
            for name in names:
                log.info("schedule %s", what, extra={"schedule": name, "change": what})
        return report

    async def all(self) -> list[ScheduleState]:
        """Every schedule in the table, removed ones too, by name."""
        async with self._runs.transaction() as tx:
            return await self._store.all(tx)

    async def get(self, name: str) -> ScheduleState:
        async with self._runs.transaction() as tx:
            return await self._existing(tx, name, lock=False)

    async def pause(self, name: str) -> ScheduleState:
        """Stop ticking ``name`` until it is resumed (a sync keeps it paused)."""
        async with self._runs.transaction() as tx:
            state = await self._existing(tx, name, lock=True)
            if state.paused:
                return state
            changed = ticks.paused(state, await self._now(tx))
            await self._store.put(tx, changed)
        log.info("schedule paused", extra={"schedule": name})
        return changed

    async def resume(self, name: str) -> ScheduleState:
        """Tick ``name`` again from its first tick after now (nothing missed while paused is
        caught up)."""
        async with self._runs.transaction() as tx:
            state = await self._existing(tx, name, lock=True)
            if not state.paused:
                return state
            changed = ticks.resumed(state, await self._now(tx))
            await self._store.put(tx, changed)
        log.info("schedule resumed", extra={"schedule": name})
        return changed

    async def ticks(self, name: str, *, limit: int = 20) -> list[ScheduleTick]:
        """The schedule's latest claimed ticks and their runs, newest first."""
        async with self._runs.transaction() as tx:
            await self._existing(tx, name, lock=False)
            return await self._store.ticks(tx, name, limit)

    async def _existing(self, tx: Transaction, name: str, *, lock: bool) -> ScheduleState:
        state = await self._store.get(tx, name, lock=lock)
        if state is None:
            raise ScheduleNotFound(f"no schedule {name!r}")
        return state
