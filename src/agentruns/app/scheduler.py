"""``AgentScheduler``: enqueues due schedule ticks, on any replica, without a leader.

Each pass lists the due schedules of the kinds this process registers, then ticks each in a
transaction of its own: lock the schedule's row (``SKIP LOCKED``: a row another replica holds is
that replica's to tick), let the domain plan its ticks (the catch-up policy applied), and for
each tick claim it in the ticks table and enqueue its run through :meth:`AgentRuns.enqueue`, all
in that one transaction, then move the schedule's next tick. The unique key on (schedule, tick)
makes a second claim of a tick a no-op, so a tick is never enqueued twice; a crash before the
commit rolls the claim, the run and the next tick back together, so the next pass (here or on
another replica) enqueues it: no tick is lost. None of it touches the claim path.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from agentruns.app.ports import Transaction
from agentruns.app.runs import AgentRuns
from agentruns.app.schedule_ports import ScheduleStore
from agentruns.domain.run import AgentRun
from agentruns.domain.ticks import ScheduleState, fired, plan_ticks

log = logging.getLogger("agentruns.scheduler")

# A loop never sleeps less than this, so a clock a hair behind a tick does not spin.
_MIN_WAIT = 0.01


@dataclass
class SchedulerReport:
    """What one pass did. ``already`` counts ticks another replica had claimed; ``busy``
    schedules another replica was ticking; ``skipped`` spans of missed ticks the catch-up policy
    dropped. ``next_due_at`` is the earliest next tick after the pass, on the store's clock."""

    enqueued: list[tuple[str, datetime, AgentRun]] = field(default_factory=list)
    already: int = 0
    busy: int = 0
    skipped: int = 0
    failed: int = 0
    now: datetime | None = None
    next_due_at: datetime | None = None


class AgentScheduler:
    def __init__(
        self,
        runs: AgentRuns,
        store: ScheduleStore,
        *,
        batch: int = 100,
        tick_retention: timedelta = timedelta(days=7),
    ) -> None:
        self._runs = runs
        self._store = store
        self._batch = batch
        self._retention = tick_retention

    async def tick(self) -> SchedulerReport:
        """One pass over every schedule due now (up to ``batch`` of them)."""
        report = SchedulerReport()
        kinds = self._runs.kinds.names()
        async with self._runs.transaction() as tx:
            names = await self._store.due(tx, kinds, self._batch)
        for name in names:
            # Counted only once its transaction committed: a failed commit leaves the ticks
            # unclaimed for the next pass.
            one = SchedulerReport()
            try:
                async with self._runs.transaction() as tx:
                    await self._tick_one(tx, name, one)
            except Exception:  # retried on the next pass; the others go on
                report.failed += 1
                log.exception("schedule tick failed", extra={"schedule": name})
                continue
            report.enqueued.extend(one.enqueued)
            for schedule, tick_at, run in one.enqueued:
                log.info(
                    "schedule tick enqueued",
                    extra={
                        "schedule": schedule,
                        "tick": tick_at.isoformat(),
                        "run_id": str(run.id),
                        "kind": run.kind,
                        "workspace": run.workspace,
                        "subject": run.subject,
                        "epoch": run.epoch,
                    },
                )
            report.already += one.already
            report.busy += one.busy
            report.skipped += one.skipped
        async with self._runs.transaction() as tx:
            report.now = await self._runs.stores.runs.now(tx)
            report.next_due_at = await self._store.next_due(tx, kinds)
        return report

    async def _tick_one(self, tx: Transaction, name: str, report: SchedulerReport) -> None:
        state = await self._store.lock_due(tx, name)
        if state is None:
            report.busy += 1
            return
        now = await self._runs.stores.runs.now(tx)
        plan = plan_ticks(state.schedule, state.next_tick_at, now)
        last: tuple[datetime, UUID] | None = None
        for tick_at in plan.ticks:
            if not await self._store.claim_tick(tx, name, tick_at):
                report.already += 1
                continue
            run = await self._enqueue(tx, state, tick_at)
            await self._store.record_tick(tx, name, tick_at, run.id)
            last = (tick_at, run.id)
            report.enqueued.append((name, tick_at, run))
        await self._store.put(tx, fired(state, plan, last))
        await self._store.prune_ticks(tx, name, now - self._retention)
        if plan.skipped is not None:
            report.skipped += 1
            start, end = plan.skipped
            log.info(
                "missed schedule ticks skipped",
                extra={
                    "schedule": name,
                    "catch_up": str(state.schedule.catch_up),
                    "from": start.isoformat(),
                    "until": end.isoformat(),
                },
            )

    async def _enqueue(self, tx: Transaction, state: ScheduleState, tick_at: datetime) -> AgentRun:
        schedule = state.schedule
        return await self._runs.enqueue(
            schedule.kind,
            workspace=schedule.workspace,
            subject=schedule.run_subject(tick_at),
            band=schedule.band,
            payload=schedule.payload,
            due_at=tick_at,
            tx=tx,
        )

    async def run(self, stop: asyncio.Event, *, every: float) -> None:
        """Pass until ``stop`` is set: again at the next tick, or after ``every`` seconds at the
        latest (to see schedules other processes synced or resumed). A failing pass is logged."""
        while not stop.is_set():
            wait = every
            try:
                report = await self.tick()
                if report.next_due_at is not None and report.now is not None:
                    until_due = (report.next_due_at - report.now).total_seconds()
                    wait = min(every, max(until_due, _MIN_WAIT))
            except Exception:
                log.exception("scheduler pass failed")
            try:
                async with asyncio.timeout(wait):
                    await stop.wait()
            except TimeoutError:
                pass
