"""The testing kit crosses schedule ticks: a host's test says "after three days, three digests
ran" without waiting three days."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import agentruns.testing
from agentruns.app.kinds import RunKind, StepEvent
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.schedule import Schedule
from agentruns.domain.termination import RunOutcome

START = datetime(2026, 3, 27, 12, 0, tzinfo=UTC)  # Paris moves its clocks on the 29th
PARIS = ZoneInfo("Europe/Paris")


async def digest(run: AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("digest sent", {"subject": run.subject})


DIGEST = RunKind(RunKindPolicy(name="digest"), digest)
DAILY = Schedule(
    "daily-digest",
    kind="digest",
    cron="30 2 * * *",
    timezone="Europe/Paris",
    workspace="acme",
    subject="digest:{date}",
)


async def test_after_three_days_three_digests_ran() -> None:
    """Drained to three days later, the schedule ticked three times (once on the DST day, at
    03:00), and each tick's run completed."""
    harness = agentruns.testing.harness(DIGEST, schedules=[DAILY], start=START)
    report = await harness.drain(until=START + timedelta(days=3))

    assert report.scheduled == 3
    assert report.outcomes == {RunOutcome.COMPLETED: 3}
    assert harness.clock.now() == START + timedelta(days=3)
    runs = harness.all_runs()
    assert [run.subject for run in runs] == [
        "digest:2026-03-28",
        "digest:2026-03-29",
        "digest:2026-03-30",
    ]
    assert [run.due_at.astimezone(PARIS).strftime("%H:%M") for run in runs] == [
        "02:30",
        "03:00",
        "02:30",
    ]


async def test_a_drain_without_until_does_not_move_the_clock_to_a_tick() -> None:
    """Without ``until`` there is no end to a schedule: drain runs what is due and stops."""
    harness = agentruns.testing.harness(DIGEST, schedules=[DAILY], start=START)
    report = await harness.drain()
    assert (report.scheduled, harness.clock.now()) == (0, START)


async def test_a_paused_schedule_runs_nothing_across_the_days() -> None:
    harness = agentruns.testing.harness(DIGEST, schedules=[DAILY], start=START)
    await harness.schedules.sync()
    await harness.schedules.pause("daily-digest")
    report = await harness.drain(until=START + timedelta(days=3))
    assert report.scheduled == 0
    assert harness.all_runs() == []
