"""Schedules as values: what a definition accepts, the subject it renders for a tick, the
catch-up plan after downtime, pause and resume, and what a sync changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, strategies as st

from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.domain.bands import Band
from agentruns.domain.errors import InvalidSchedule
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.schedule import CatchUp, Schedule, Schedules
from agentruns.domain.ticks import (
    ScheduleState,
    added,
    fired,
    paused,
    plan_ticks,
    reconcile,
    resumed,
)
from tests.strategies import intervals, minute_crons, schedule_moments, schedule_zones

NOON = datetime(2026, 3, 1, 12, tzinfo=UTC)
HOUR = timedelta(hours=1)


def schedule(**changes: object) -> Schedule:
    fields: dict[str, object] = {
        "name": "digest",
        "kind": "digest",
        "workspace": "acme",
        "subject": "digest:{date}",
        "cron": "0 * * * *",
    }
    fields.update(changes)
    return Schedule(**fields)  # type: ignore[arg-type]


# -- the definition -----------------------------------------------------------------------------


def test_a_schedule_normalises_its_fields_and_defaults_to_background_latest() -> None:
    made = schedule(cron="  0   7 * * 1-5 ", band="batch", catch_up="ALL", payload={"a": [1]})
    assert (made.cron, made.band, made.catch_up) == ("0 7 * * 1-5", Band.BATCH, CatchUp.ALL)
    plain = schedule()
    assert (plain.band, plain.catch_up, plain.timezone) == (Band.BACKGROUND, CatchUp.LATEST, "UTC")


def test_the_subject_template_renders_the_tick_in_the_schedules_timezone() -> None:
    made = schedule(
        timezone="Europe/Paris",
        subject="{schedule}|{date}|{time}|{tick}|{tick:%G-W%V}|{date:%d/%m}",
    )
    tick = datetime(2026, 3, 1, 23, 30, tzinfo=UTC)  # already 2 March in Paris
    assert made.run_subject(tick) == (
        "digest|2026-03-02|00:30:00|2026-03-02T00:30:00+01:00|2026-W10|02/03"
    )


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"cron": None}, "exactly one of cron or every"),
        ({"every": timedelta(minutes=5)}, "exactly one of cron or every"),
        ({"cron": "99 * * * *"}, "bad cron expression"),
        ({"timezone": "Nowhere/Land"}, "unknown timezone"),
        ({"subject": "digest:{day}"}, "unknown placeholder 'day'"),
        ({"subject": "digest:{date"}, "bad subject template"),
        ({"subject": "digest:{0}"}, "bad subject template"),
        ({"subject": " "}, "non-empty"),
        ({"subject": "x" * 600}, "longer than"),
        ({"name": ""}, "non-empty"),
        ({"band": "urgent"}, "unknown band"),
        ({"payload": [1, 2]}, "JSON object"),
        ({"catch_up": "some"}, "unknown catch-up"),
        ({"catch_up_limit": 0}, "catch_up_limit"),
        ({"grace": timedelta(seconds=-1)}, "grace"),
    ],
)
def test_a_schedule_that_cannot_tick_is_refused_with_a_clear_error(
    changes: dict[str, object], fragment: str
) -> None:
    with pytest.raises(InvalidSchedule, match=fragment):
        schedule(**changes)


def test_schedules_are_unique_by_name_and_name_a_registered_kind() -> None:
    with pytest.raises(InvalidSchedule, match="declared twice"):
        Schedules([schedule(), schedule(cron="5 * * * *")])

    async def steps(run: AgentRun):  # type: ignore[no-untyped-def]
        yield StepEvent("done")

    digest = RunKind(RunKindPolicy(name="digest"), steps)
    kinds = RunKinds([digest], schedules=[schedule()])
    assert kinds.schedules.names() == ["digest"]
    with pytest.raises(InvalidSchedule, match="not registered"):
        RunKinds([digest], schedules=[schedule(name="other", kind="missing")])


# -- the plan of a pass -------------------------------------------------------------------------


def test_nothing_is_due_before_the_pending_tick() -> None:
    plan = plan_ticks(schedule(), NOON + HOUR, NOON + timedelta(minutes=59))
    assert (plan.ticks, plan.next_tick_at, plan.skipped) == ((), NOON + HOUR, None)


def test_ticks_seen_within_grace_are_on_time_and_all_enqueued() -> None:
    """A scheduler that passes every few seconds enqueues every second of an every-second
    schedule, whatever the catch-up policy."""
    for policy in CatchUp:
        every_second = schedule(cron=None, every=timedelta(seconds=1), catch_up=policy)
        plan = plan_ticks(every_second, NOON, NOON + timedelta(seconds=4, milliseconds=300))
        assert plan.ticks == tuple(NOON + timedelta(seconds=s) for s in range(5))
        assert (plan.next_tick_at, plan.skipped) == (NOON + timedelta(seconds=5), None)


@pytest.mark.parametrize(
    ("policy", "limit", "expected", "skipped_until"),
    [
        (CatchUp.LATEST, 10, [3], 3),
        (CatchUp.ALL, 10, [0, 1, 2, 3], None),
        (CatchUp.ALL, 2, [2, 3], 2),
        (CatchUp.NONE, 10, [], None),
    ],
)
def test_missed_ticks_follow_the_catch_up_policy(
    policy: CatchUp, limit: int, expected: list[int], skipped_until: int | None
) -> None:
    """Hourly from noon, no scheduler until 15:30: four ticks were missed."""
    made = schedule(catch_up=policy, catch_up_limit=limit)
    now = NOON + timedelta(hours=3, minutes=30)
    plan = plan_ticks(made, NOON, now)
    assert plan.ticks == tuple(NOON + hours * HOUR for hours in expected)
    assert plan.next_tick_at == NOON + 4 * HOUR
    if policy is CatchUp.NONE:
        assert plan.skipped == (NOON, now - made.grace)
    elif skipped_until is None:
        assert plan.skipped is None
    else:
        assert plan.skipped == (NOON, NOON + skipped_until * HOUR)


def test_latest_enqueues_no_missed_tick_beside_one_on_time() -> None:
    """Back up a few seconds after 15:00: the 15:00 tick is on time, the missed ones go."""
    plan = plan_ticks(schedule(), NOON, NOON + 3 * HOUR + timedelta(seconds=5))
    assert plan.ticks == (NOON + 3 * HOUR,)
    assert plan.skipped == (NOON, NOON + 3 * HOUR)


@given(
    cron=minute_crons,
    zone=schedule_zones,
    every=intervals,
    use_cron=st.booleans(),
    policy=st.sampled_from(list(CatchUp)),
    limit=st.integers(min_value=1, max_value=5),
    grace_seconds=st.integers(min_value=0, max_value=7200),
    pending_at=schedule_moments,
    down_seconds=st.integers(min_value=0, max_value=3 * 86400),
)
def test_a_plan_enqueues_due_ticks_only_keeps_the_on_time_ones_and_moves_past_now(
    cron: str,
    zone: str,
    every: timedelta,
    use_cron: bool,
    policy: CatchUp,
    limit: int,
    grace_seconds: int,
    pending_at: datetime,
    down_seconds: int,
) -> None:
    """Planned ticks are distinct due ticks in [pending, now], oldest first; every on-time tick
    is among them; missed ones never exceed the limit (one for latest, none for none), yet
    latest and all enqueue at least one; the next tick is the first after now."""
    timing = {"cron": cron, "timezone": zone} if use_cron else {"cron": None, "every": every}
    made = schedule(
        catch_up=policy, catch_up_limit=limit, grace=timedelta(seconds=grace_seconds), **timing
    )
    pending = made.next_after(pending_at)
    assert pending is not None
    now = pending + timedelta(seconds=down_seconds)
    plan = plan_ticks(made, pending, now)
    assert list(plan.ticks) == sorted(set(plan.ticks))
    assert all(
        pending <= tick <= now and made.last_at_or_before(tick) == tick for tick in plan.ticks
    )
    on_time_from = now - made.grace
    missed = [tick for tick in plan.ticks if tick < on_time_from]
    allowed = {CatchUp.ALL: limit, CatchUp.LATEST: 1, CatchUp.NONE: 0}[policy]
    assert len(missed) <= allowed
    first_on_time = made.next_after(max(pending, on_time_from) - timedelta(microseconds=1))
    if first_on_time is not None and first_on_time <= now:
        assert first_on_time in plan.ticks
    assert plan.next_tick_at == made.next_after(now)
    # The pending tick was due, so latest and all always enqueue something; none only on time.
    if policy is CatchUp.NONE:
        assert missed == []
    else:
        assert plan.ticks


# -- state ---------------------------------------------------------------------------------------


def test_pause_keeps_the_next_tick_and_resume_starts_after_now() -> None:
    state = added(schedule(), NOON)
    assert state.next_tick_at == NOON + HOUR
    assert state.is_due(NOON + HOUR)
    held = paused(state, NOON + timedelta(minutes=5))
    assert not held.is_due(NOON + 5 * HOUR)
    back = resumed(held, NOON + timedelta(hours=4, minutes=10))
    assert (back.paused, back.next_tick_at) == (False, NOON + 5 * HOUR)


def test_fired_records_the_newest_tick_and_its_run() -> None:
    import uuid

    state = added(schedule(), NOON)
    plan = plan_ticks(state.schedule, state.next_tick_at, NOON + 2 * HOUR)
    run_id = uuid.UUID(int=7)
    after = fired(state, plan, (NOON + 2 * HOUR, run_id))
    assert (after.last_tick_at, after.last_run, after.next_tick_at) == (
        NOON + 2 * HOUR,
        run_id,
        NOON + 3 * HOUR,
    )
    unchanged = fired(after, plan_ticks(state.schedule, None, NOON), None)
    assert unchanged.last_run == run_id
    assert after.updated_at == state.updated_at == NOON  # ticking is not a change


def test_reconcile_adds_back_a_removed_schedule_from_the_next_tick() -> None:
    declared = Schedules([schedule()])
    gone = ScheduleState(
        schedule(), NOON, NOON, NOON + HOUR, removed_at=NOON + timedelta(minutes=1)
    )
    plan = reconcile(declared, [gone], {"digest"}, NOON + 5 * HOUR + timedelta(minutes=1))
    [back] = plan.added
    assert (back.removed_at, back.next_tick_at) == (None, NOON + 6 * HOUR)
    assert plan.changed == plan.removed == []
