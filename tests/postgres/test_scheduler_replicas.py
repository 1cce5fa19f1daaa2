"""Scheduler replicas on one PostgreSQL, each with its own pool, under one pinned clock: every
tick enqueued exactly once, a tick claim that waits for another's commit, and a replica whose
connection dies mid-tick losing no tick."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import text

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.postgres import PostgresFamily
from agentruns.adapters.postgres.database import fetch
from agentruns.app.kinds import NoDomainRow, RunKind, RunKinds, StepEvent
from agentruns.app.ports import Transaction
from agentruns.app.runs import AgentRuns
from agentruns.app.scheduler import AgentScheduler
from agentruns.app.schedules import AgentSchedules
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.schedule import Schedule

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
EVERY_MINUTE = Schedule(
    "minutely", kind="tick", cron="* * * * *", workspace="ops", subject="minute:{time}"
)


async def _steps(run: AgentRun):  # type: ignore[no-untyped-def]
    yield StepEvent("ticked")


def kinds(handler: NoDomainRow | None = None) -> RunKinds:
    kind = RunKind(RunKindPolicy(name="tick"), _steps, handler or NoDomainRow())
    return RunKinds([kind], schedules=[EVERY_MINUTE])


class Replica:
    """One scheduler process: its own pool on the shared database and the shared clock."""

    def __init__(self, url: str, clock: ManualClock, registry: RunKinds) -> None:
        self.family = PostgresFamily(url, clock, pool_size=2)
        self.runs = AgentRuns(self.family.stores, registry, random.Random(3))
        self.schedules = AgentSchedules(self.runs, self.family.schedules)
        self.scheduler = AgentScheduler(self.runs, self.family.schedules)


ReplicaMaker = Callable[..., Replica]


@pytest.fixture
async def replica(postgres_url: str) -> AsyncIterator[ReplicaMaker]:
    made: list[Replica] = []

    def make(clock: ManualClock, registry: RunKinds | None = None) -> Replica:
        made.append(Replica(postgres_url, clock, registry or kinds()))
        return made[-1]

    yield make
    for each in made:
        await each.family.close()


def tick_rows(url: str) -> list[tuple[datetime, int]]:
    """Each claimed tick and how many runs carry its subject (the runs table, not the ticks)."""
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            """
            SELECT t.tick_at, (SELECT count(*) FROM agent_run r
                               WHERE r.kind = 'tick' AND r.due_at = t.tick_at)
            FROM agent_schedule_tick t ORDER BY t.tick_at
            """
        ).fetchall()
        total = connection.execute("SELECT count(*) FROM agent_run").fetchone()
    assert total is not None
    assert total[0] == sum(int(count) for _, count in rows)  # type: ignore[call-overload]
    return [(tick_at, int(count)) for tick_at, count in rows]  # type: ignore[call-overload]


async def test_three_replicas_over_five_minutes_enqueue_exactly_one_run_per_tick(
    replica: ReplicaMaker, postgres_url: str
) -> None:
    """Three replicas pass together at uneven steps of the pinned clock for five minutes:
    five ticks, five runs, one each."""
    clock = ManualClock(START)
    replicas = [replica(clock) for _ in range(3)]
    await replicas[0].schedules.sync()
    steps = random.Random(11)
    enqueued = 0
    while clock.now() < START + 5 * MINUTE + timedelta(seconds=20):
        clock.advance(timedelta(seconds=steps.randint(1, 13)))
        reports = await asyncio.gather(*(each.scheduler.tick() for each in replicas))
        enqueued += sum(len(report.enqueued) for report in reports)
    assert tick_rows(postgres_url) == [(START + n * MINUTE, 1) for n in range(1, 6)]
    assert enqueued == 5


async def test_a_tick_claim_waits_for_the_claim_before_it_and_counts_only_if_it_commits(
    replica: ReplicaMaker,
) -> None:
    """Two transactions claim one tick: the second waits; a commit makes it a no-op, a
    rollback lets it claim the tick (so a crash never loses it)."""
    clock = ManualClock(START)
    first, second = replica(clock), replica(clock)
    await first.schedules.sync()
    store_a, store_b = first.family.schedules, second.family.schedules
    for outcome, expected in (("commit", False), ("rollback", True)):
        tick_at = START + (MINUTE if outcome == "commit" else 2 * MINUTE)
        scope = first.family.stores.scope
        tx_a = scope.transaction()
        opened = await tx_a.__aenter__()
        assert await store_a.claim_tick(opened, "minutely", tick_at)

        async def claim_b(at: datetime = tick_at) -> bool:
            async with second.family.stores.scope.transaction() as tx_b:
                return await store_b.claim_tick(tx_b, "minutely", at)

        waiting = asyncio.create_task(claim_b())
        await asyncio.sleep(0.3)
        assert not waiting.done()  # blocked on the unique key
        if outcome == "commit":
            await tx_a.__aexit__(None, None, None)
        else:
            await tx_a.__aexit__(RuntimeError, RuntimeError("crash"), None)
        assert await asyncio.wait_for(waiting, 10) is expected


class _StallsOnce(NoDomainRow):
    """A handler that, on its first enqueue, notes its connection's server pid and waits: the
    replica is then mid-tick, holding the schedule's row and the tick's claim."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.inside = asyncio.Event()
        self.go_on = asyncio.Event()

    async def on_moved(self, tx: Transaction, run: AgentRun) -> None:
        if self.pid is not None:
            return
        rows = await fetch(tx, text("SELECT pg_backend_pid() AS pid"), {})
        self.pid = int(rows[0]["pid"])
        self.inside.set()
        await self.go_on.wait()


async def test_a_replica_killed_mid_tick_loses_no_tick(
    replica: ReplicaMaker, postgres_url: str
) -> None:
    """Replica A dies (its server connection is terminated) inside its tick's transaction; B
    skipped the row A held, and its next pass enqueues the tick, once."""
    clock = ManualClock(START)
    stalls = _StallsOnce()
    doomed = replica(clock, kinds(stalls))
    survivor = replica(clock)
    await survivor.schedules.sync()
    clock.advance(MINUTE + timedelta(seconds=2))

    dying = asyncio.create_task(doomed.scheduler.tick())
    await asyncio.wait_for(stalls.inside.wait(), 10)
    busy = await survivor.scheduler.tick()
    assert (busy.enqueued, busy.busy) == ([], 1)

    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (stalls.pid,))
    stalls.go_on.set()
    died = await asyncio.wait_for(dying, 30)
    assert (died.enqueued, died.failed) == ([], 1)
    assert tick_rows(postgres_url) == []

    recovered = await survivor.scheduler.tick()
    [(_, tick_at, _)] = recovered.enqueued
    assert tick_at == START + MINUTE
    assert tick_rows(postgres_url) == [(START + MINUTE, 1)]
