"""Schedules on both adapters: sync, ticks enqueued once through the run-insert path, catch-up
after downtime, pause and resume, and a tick never lost to a pass that fails mid-way."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta

import pytest

from agentruns.app.kinds import NoDomainRow, RunKind, RunKinds
from agentruns.app.ports import Transaction
from agentruns.app.runs import AgentRuns
from agentruns.app.scheduler import AgentScheduler
from agentruns.app.schedules import AgentSchedules
from agentruns.domain.bands import Band
from agentruns.domain.errors import ScheduleNotFound
from agentruns.domain.run import AgentRun
from agentruns.domain.schedule import Schedule
from agentruns.domain.states import AgentRunState
from tests.contract.conftest import START, Backend

MINUTE = timedelta(minutes=1)


def every_minute(**changes: object) -> Schedule:
    fields: dict[str, object] = {
        "name": "minutely",
        "kind": "chat",
        "workspace": "acme",
        "subject": "minute:{time}",
        "cron": "* * * * *",
        "payload": {"steps": 1},
    }
    fields.update(changes)
    return Schedule(**fields)  # type: ignore[arg-type]


def hourly(catch_up: str, **changes: object) -> Schedule:
    return every_minute(name=f"hourly-{catch_up}", cron="0 * * * *", catch_up=catch_up, **changes)


def schedules(backend: Backend, runs: AgentRuns) -> AgentSchedules:
    return AgentSchedules(runs, backend.family.schedules)


def scheduler(backend: Backend, runs: AgentRuns) -> AgentScheduler:
    return AgentScheduler(runs, backend.family.schedules)


async def runs_of(backend: Backend, runs: AgentRuns, kind: str = "chat") -> list[AgentRun]:
    """Every run of ``kind``, by due time (read through the ticks the schedules recorded)."""
    found: list[AgentRun] = []
    async with runs.transaction() as tx:
        for state in await backend.family.schedules.all(tx):
            for tick in await backend.family.schedules.ticks(tx, state.name, 10_000):
                assert tick.run_id is not None
                run = await backend.stores.runs.get(tx, tick.run_id)
                assert run is not None
                found.append(run)
    return sorted((run for run in found if run.kind == kind), key=lambda run: run.due_at)


async def test_sync_adds_changes_and_removes_only_its_own_kinds(
    backend: Backend, runs: AgentRuns, kinds: RunKinds
) -> None:
    """A sync writes declared schedules, reports changes, marks undeclared ones of its kinds
    removed and leaves another process's kinds alone."""
    kinds.schedule(every_minute())
    kinds.schedule(hourly("latest", kind="sweep"))
    report = await schedules(backend, runs).sync()
    assert (report.added, report.changed, report.removed) == (
        ["hourly-latest", "minutely"],
        [],
        [],
    )
    [hourly_state, minutely] = await schedules(backend, runs).all()
    assert minutely.next_tick_at == START + MINUTE
    assert hourly_state.next_tick_at == START + timedelta(hours=1)
    again = await schedules(backend, runs).sync()
    assert again.unchanged == ["hourly-latest", "minutely"]

    # Another process registers only "chat", declares minutely with a new band and a new cron.
    backend.clock.advance(timedelta(seconds=90))
    other = RunKinds(
        [kinds.get("chat")], schedules=[every_minute(band="batch", cron="*/5 * * * *")]
    )
    changed = await schedules(backend, AgentRuns(backend.stores, other, random.Random(1))).sync()
    assert (changed.changed, changed.removed) == (["minutely"], [])
    state = await schedules(backend, runs).get("minutely")
    assert state.schedule.band is Band.BATCH
    assert state.next_tick_at == START + timedelta(minutes=5)

    # Only the band changes: the next tick stays where it was.
    backend.clock.advance(MINUTE)
    same_timing = RunKinds([kinds.get("chat")], schedules=[every_minute(cron="*/5 * * * *")])
    await schedules(backend, AgentRuns(backend.stores, same_timing, random.Random(1))).sync()
    assert (await schedules(backend, runs).get("minutely")).next_tick_at == START + 5 * MINUTE

    # A process of "chat" that declares nothing removes minutely, never the sweep schedule.
    bare = AgentRuns(backend.stores, RunKinds([kinds.get("chat")]), random.Random(1))
    dropped = await schedules(backend, bare).sync()
    assert dropped.removed == ["minutely"]
    listed = {state.name: state for state in await schedules(backend, runs).all()}
    assert listed["minutely"].removed_at == START + timedelta(seconds=150)
    assert listed["hourly-latest"].removed_at is None


async def test_a_due_tick_enqueues_one_run_through_the_run_insert_path(
    backend: Backend, runs: AgentRuns, kinds: RunKinds
) -> None:
    """The tick's run has the schedule's kind, workspace, band and payload, the subject
    rendered for the tick, is due at the tick, and is recorded with the tick."""
    kinds.schedule(every_minute(name="reviews", kind="review", subject="review:{date}:{time}"))
    await schedules(backend, runs).sync()
    assert (await scheduler(backend, runs).tick()).enqueued == []

    backend.clock.advance(MINUTE + timedelta(seconds=3))
    report = await scheduler(backend, runs).tick()
    [(name, tick_at, run)] = report.enqueued
    assert (name, tick_at) == ("reviews", START + MINUTE)
    stored = await runs.get(run.id)
    assert (stored.kind, stored.workspace, stored.subject) == (
        "review",
        "acme",
        "review:2026-03-01:12:01:00",
    )
    assert (stored.band, stored.payload, stored.due_at) == (Band.BACKGROUND, {"steps": 1}, tick_at)
    assert stored.state is AgentRunState.QUEUED
    # The kind's handler saw the enqueue: its review job exists, as for AgentRuns.enqueue.
    async with runs.transaction() as tx:
        assert await backend.review_jobs.get(tx, run.id) is not None
    state = await schedules(backend, runs).get("reviews")
    assert (state.last_tick_at, state.last_run, state.next_tick_at) == (
        tick_at,
        run.id,
        START + 2 * MINUTE,
    )
    [tick] = await schedules(backend, runs).ticks("reviews")
    assert (tick.tick_at, tick.run_id) == (tick_at, run.id)
    # A second pass at the same moment finds nothing due.
    assert (await scheduler(backend, runs).tick()).enqueued == []


async def test_a_claimed_tick_cannot_be_claimed_again(
    backend: Backend, runs: AgentRuns, kinds: RunKinds
) -> None:
    """The ticks table's key makes a second claim of a tick a no-op, in another transaction
    or the same one."""
    kinds.schedule(every_minute())
    await schedules(backend, runs).sync()
    store = backend.family.schedules
    async with runs.transaction() as tx:
        assert await store.claim_tick(tx, "minutely", START + MINUTE)
        assert not await store.claim_tick(tx, "minutely", START + MINUTE)
    async with runs.transaction() as tx:
        assert not await store.claim_tick(tx, "minutely", START + MINUTE)
        assert await store.claim_tick(tx, "minutely", START + 2 * MINUTE)


async def test_schedulers_racing_over_five_minutes_enqueue_each_tick_once(
    backend: Backend, runs: AgentRuns, kinds: RunKinds
) -> None:
    """Three scheduler objects passing together every few seconds enqueue one run per tick."""
    kinds.schedule(every_minute())
    await schedules(backend, runs).sync()
    replicas = [scheduler(backend, runs) for _ in range(3)]
    for _ in range(5 * 60 // 7 + 1):
        backend.clock.advance(timedelta(seconds=7))
        await asyncio.gather(*(replica.tick() for replica in replicas))
    ticks = [run.due_at for run in await runs_of(backend, runs)]
    assert ticks == [START + n * MINUTE for n in range(1, 6)]


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [
        ("latest", [timedelta(hours=3)]),
        ("all", [timedelta(hours=2), timedelta(hours=3)]),
        ("none", []),
    ],
)
async def test_after_downtime_the_catch_up_policy_decides_the_missed_ticks(
    backend: Backend,
    runs: AgentRuns,
    kinds: RunKinds,
    catch_up: str,
    expected: list[timedelta],
) -> None:
    """Hourly, no scheduler for three and a half hours: latest enqueues the last missed tick,
    all the last two (its limit), none nothing; the next tick is the first after now."""
    kinds.schedule(hourly(catch_up, catch_up_limit=2))
    await schedules(backend, runs).sync()
    backend.clock.advance(timedelta(hours=3, minutes=30))
    report = await scheduler(backend, runs).tick()
    assert [tick_at - START for _, tick_at, _ in report.enqueued] == expected
    assert report.skipped == 1
    state = await schedules(backend, runs).get(f"hourly-{catch_up}")
    assert state.next_tick_at == START + timedelta(hours=4)


async def test_a_paused_schedule_does_not_tick_and_resumes_from_the_next_tick(
    backend: Backend, runs: AgentRuns, kinds: RunKinds
) -> None:
    """Paused, nothing is enqueued; a sync keeps the pause; resumed, it ticks from the first
    tick after now, without catching up the paused time."""
    kinds.schedule(every_minute())
    use_cases = schedules(backend, runs)
    await use_cases.sync()
    paused = await use_cases.pause("minutely")
    assert paused.paused
    await use_cases.sync()
    backend.clock.advance(10 * MINUTE)
    assert (await scheduler(backend, runs).tick()).enqueued == []
    assert (await use_cases.get("minutely")).paused

    backend.clock.advance(timedelta(seconds=30))
    resumed = await use_cases.resume("minutely")
    assert (resumed.paused, resumed.next_tick_at) == (False, START + 11 * MINUTE)
    backend.clock.advance(MINUTE)
    [(_, tick_at, _)] = (await scheduler(backend, runs).tick()).enqueued
    assert tick_at == START + 11 * MINUTE
    with pytest.raises(ScheduleNotFound):
        await use_cases.pause("no-such-schedule")


class _FailsOnce(NoDomainRow):
    """A kind handler whose first enqueue raises: the pass fails after claiming its tick."""

    def __init__(self) -> None:
        self.failed = False

    async def on_moved(self, tx: Transaction, run: AgentRun) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the process died mid-tick")


async def test_a_pass_that_fails_mid_tick_loses_nothing_and_the_next_pass_enqueues_it(
    backend: Backend, runs: AgentRuns, kinds: RunKinds, rng: random.Random
) -> None:
    """The claim, the run and the next tick roll back together; the next pass enqueues it."""
    failing = RunKind(kinds.get("chat").policy, kinds.get("chat").steps, _FailsOnce())
    flaky = RunKinds([failing], schedules=[every_minute()])
    flaky_runs = AgentRuns(backend.stores, flaky, rng)
    await schedules(backend, flaky_runs).sync()
    backend.clock.advance(MINUTE)

    first = await scheduler(backend, flaky_runs).tick()
    assert (first.enqueued, first.failed) == ([], 1)
    assert await schedules(backend, flaky_runs).ticks("minutely") == []
    state = await schedules(backend, flaky_runs).get("minutely")
    assert (state.next_tick_at, state.last_run) == (START + MINUTE, None)

    second = await scheduler(backend, flaky_runs).tick()
    [(_, tick_at, run)] = second.enqueued
    assert tick_at == START + MINUTE
    [tick] = await schedules(backend, flaky_runs).ticks("minutely")
    assert tick.run_id == run.id


async def test_old_ticks_are_pruned_past_the_retention(
    backend: Backend, runs: AgentRuns, kinds: RunKinds
) -> None:
    """Claimed ticks older than the retention are forgotten as the schedule ticks on."""
    kinds.schedule(every_minute())
    await schedules(backend, runs).sync()
    short = AgentScheduler(runs, backend.family.schedules, tick_retention=timedelta(minutes=2))
    for _ in range(5):
        backend.clock.advance(MINUTE)
        await short.tick()
    kept = await schedules(backend, runs).ticks("minutely")
    assert [tick.tick_at for tick in kept] == [START + n * MINUTE for n in (5, 4, 3)]


async def test_next_due_is_the_earliest_active_tick_of_the_kinds(
    backend: Backend, runs: AgentRuns, kinds: RunKinds
) -> None:
    """The loop sleeps until the earliest tick of its kinds' active schedules."""
    kinds.schedule(every_minute(cron="*/10 * * * *"))
    kinds.schedule(hourly("latest", kind="sweep"))
    await schedules(backend, runs).sync()
    report = await scheduler(backend, runs).tick()
    assert (report.now, report.next_due_at) == (START, START + 10 * MINUTE)
    await schedules(backend, runs).pause("minutely")
    report = await scheduler(backend, runs).tick()
    assert report.next_due_at == START + timedelta(hours=1)
    assert isinstance(report.now, datetime)
