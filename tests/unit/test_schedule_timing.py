"""When schedules tick: cron in a timezone across DST, fixed intervals, and the properties every
timing keeps (ticks whole seconds, none between a moment and the next, next and last agree)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, strategies as st

from agentruns.domain.errors import InvalidSchedule
from agentruns.domain.timing import Cron, Interval, Timing
from tests.strategies import intervals, minute_crons, schedule_moments, schedule_zones

PARIS = "Europe/Paris"
NEW_YORK = "America/New_York"
MICRO = timedelta(microseconds=1)


def ticks_between(timing: Timing, start: datetime, end: datetime) -> list[datetime]:
    found = []
    tick = timing.next_after(start)
    while tick is not None and tick <= end:
        found.append(tick)
        tick = timing.next_after(tick)
    return found


def local(moments: list[datetime], zone: str) -> list[str]:
    return [moment.astimezone(ZoneInfo(zone)).strftime("%m-%d %H:%M %Z") for moment in moments]


# -- DST, spelled out ---------------------------------------------------------------------------


def test_a_skipped_local_time_fires_once_at_the_next_valid_time() -> None:
    """Paris skips 02:00-03:00 on 29 March 2026: 02:30 fires at 03:00 that day, once."""
    cron = Cron("30 2 * * *", PARIS)
    ticks = ticks_between(
        cron, datetime(2026, 3, 27, tzinfo=UTC), datetime(2026, 3, 31, tzinfo=UTC)
    )
    assert local(ticks, PARIS) == [
        "03-27 02:30 CET",
        "03-28 02:30 CET",
        "03-29 03:00 CEST",
        "03-30 02:30 CEST",
    ]


def test_a_repeated_local_time_fires_once_at_its_first_occurrence() -> None:
    """Paris repeats 02:00-03:00 on 25 October 2026: 02:30 fires in the first pass only."""
    cron = Cron("30 2 * * *", PARIS)
    ticks = ticks_between(
        cron, datetime(2026, 10, 24, tzinfo=UTC), datetime(2026, 10, 27, tzinfo=UTC)
    )
    assert local(ticks, PARIS) == ["10-24 02:30 CEST", "10-25 02:30 CEST", "10-26 02:30 CET"]
    assert ticks[1] == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)


def test_frequent_ticks_skip_the_gap_and_fire_the_repeated_hour_once() -> None:
    """Every 15 minutes in New York: the skipped hour collapses into one tick at 03:00; the
    repeated hour's wall times fire once, so the clock's second pass has no ticks."""
    cron = Cron("*/15 * * * *", NEW_YORK)
    spring = ticks_between(
        cron, datetime(2026, 3, 8, 6, 30, tzinfo=UTC), datetime(2026, 3, 8, 7, 30, tzinfo=UTC)
    )
    assert local(spring, NEW_YORK) == [
        "03-08 01:45 EST",
        "03-08 03:00 EDT",
        "03-08 03:15 EDT",
        "03-08 03:30 EDT",
    ]
    autumn = ticks_between(
        cron, datetime(2026, 11, 1, 5, 30, tzinfo=UTC), datetime(2026, 11, 1, 7, 30, tzinfo=UTC)
    )
    assert local(autumn, NEW_YORK) == [
        "11-01 01:45 EDT",
        "11-01 02:00 EST",
        "11-01 02:15 EST",
        "11-01 02:30 EST",
    ]
    assert autumn[1] - autumn[0] == timedelta(minutes=75)


def test_a_half_hour_dst_shift_is_handled_like_a_whole_one() -> None:
    """Lord Howe moves its clocks by 30 minutes: 02:15 on the spring day fires at 02:30."""
    zone = "Australia/Lord_Howe"
    cron = Cron("15 2 * * *", zone)
    ticks = ticks_between(
        cron, datetime(2026, 10, 2, tzinfo=UTC), datetime(2026, 10, 5, tzinfo=UTC)
    )
    assert [moment.astimezone(ZoneInfo(zone)).strftime("%d %H:%M") for moment in ticks] == [
        "03 02:15",
        "04 02:30",
        "05 02:15",
    ]


def test_a_second_pass_moment_finds_the_last_tick_in_the_first_pass() -> None:
    """At 02:30 of the second pass, the last tick of */20 is 02:40 of the first pass."""
    cron = Cron("*/20 * * * *", PARIS)
    second_pass = datetime(2026, 10, 25, 1, 30, tzinfo=UTC)  # 02:30 CET
    assert cron.last_at_or_before(second_pass) == datetime(2026, 10, 25, 0, 40, tzinfo=UTC)
    assert cron.next_after(second_pass) == datetime(2026, 10, 25, 2, 0, tzinfo=UTC)  # 03:00 CET


def test_an_interval_counts_absolute_time_from_the_unix_epoch() -> None:
    """Every 90 minutes falls on the same instants for every replica, DST or not."""
    interval = Interval(timedelta(minutes=90))
    start = datetime(2026, 3, 29, tzinfo=UTC)
    ticks = ticks_between(interval, start, start + timedelta(hours=6))
    assert [tick - start for tick in ticks] == [
        timedelta(hours=1, minutes=30) * n for n in range(1, 5)
    ]
    assert interval.last_at_or_before(ticks[0]) == ticks[0]


def test_six_fields_tick_by_the_second() -> None:
    cron = Cron("*/20 * * * * *")
    start = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert ticks_between(cron, start, start + timedelta(minutes=1)) == [
        start + timedelta(seconds=s) for s in (20, 40, 60)
    ]


@pytest.mark.parametrize(
    ("expression", "zone", "every"),
    [
        ("61 * * * *", "UTC", None),
        ("* * *", "UTC", None),
        ("0 0 30 2 *", "UTC", None),
        ("* * * * *", "Mars/Olympus_Mons", None),
        (None, "UTC", timedelta(milliseconds=500)),
        (None, "UTC", timedelta(seconds=1.5)),
        (None, "UTC", timedelta(0)),
        (None, "UTC", timedelta(days=3_000_000)),
        (None, "UTC", timedelta(days=36_501)),
    ],
)
def test_a_timing_that_cannot_tick_is_refused(
    expression: str | None, zone: str, every: timedelta | None
) -> None:
    def build() -> Timing:
        return Interval(every) if every is not None else Cron(str(expression), zone)

    with pytest.raises(InvalidSchedule):
        build()


def test_a_schedule_of_an_interval_past_a_century_is_refused_at_declaration() -> None:
    from agentruns import Schedule

    with pytest.raises(InvalidSchedule, match="at most 36500 days"):
        Schedule("rare", kind="k", every=timedelta(days=3_000_000), workspace="w", subject="s")


def test_the_longest_interval_has_no_tick_past_the_year_9999_and_none_before_the_year_1() -> None:
    century = Interval(timedelta(days=36_500))
    assert century.next_after(datetime(9990, 1, 1, tzinfo=UTC)) is None
    assert century.last_at_or_before(datetime(1, 1, 2, tzinfo=UTC)) is None
    assert century.next_after(datetime(2026, 1, 1, tzinfo=UTC)) == datetime(2069, 12, 7, tzinfo=UTC)


# -- properties ---------------------------------------------------------------------------------


def _timings() -> st.SearchStrategy[Timing]:
    crons = st.builds(Cron, minute_crons, schedule_zones)
    seconds = st.builds(Cron, st.just("*/7 * * * * *"), schedule_zones)
    return st.one_of(crons, seconds, st.builds(Interval, intervals))


@given(timing=_timings(), moment=schedule_moments)
def test_next_and_last_agree_and_leave_no_tick_between(timing: Timing, moment: datetime) -> None:
    """next_after is after the moment, last_at_or_before at or before it, both are ticks on
    whole seconds, and no tick lies strictly between the moment and the next one."""
    following = timing.next_after(moment)
    previous = timing.last_at_or_before(moment)
    assert following is not None
    assert previous is not None
    assert previous <= moment < following
    for tick in (following, previous):
        assert tick.microsecond == 0
        assert tick.utcoffset() == timedelta(0)
        assert timing.last_at_or_before(tick) == tick
    assert timing.last_at_or_before(following - MICRO) == previous
    assert timing.next_after(previous) == following


def _field(spec: str, value: int) -> bool:
    if spec == "*":
        return True
    if spec.startswith("*/"):
        return value % int(spec[2:]) == 0
    return value in {int(part) for part in spec.split(",")}


def _reference_ticks(expression: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    """The rule, by brute force: every wall minute that matches fires at its first occurrence,
    or if the clocks skip it, at the first instant after the jump (found minute by minute)."""
    tz = ZoneInfo(zone)
    minute_spec, hour_spec = expression.split()[:2]
    wall = (start.astimezone(tz) - timedelta(hours=4)).replace(tzinfo=None, second=0, microsecond=0)
    last_wall = (end.astimezone(tz) + timedelta(hours=4)).replace(tzinfo=None)
    found: set[datetime] = set()
    while wall <= last_wall:
        if _field(minute_spec, wall.minute) and _field(hour_spec, wall.hour):
            first = wall.replace(tzinfo=tz, fold=0)
            if first.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == wall:
                found.add(first.astimezone(UTC))
            else:  # skipped: walk from the earlier reading to the first instant past the jump
                instant = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
                while instant.astimezone(tz).replace(tzinfo=None) < wall:
                    instant += timedelta(minutes=1)
                found.add(instant)
        wall += timedelta(minutes=1)
    return sorted(moment for moment in found if start < moment <= end)


@given(expression=minute_crons, zone=schedule_zones, moment=schedule_moments)
def test_cron_ticks_equal_the_wall_clock_rule_by_brute_force(
    expression: str, zone: str, moment: datetime
) -> None:
    """Over six hours, the ticks are exactly the matching wall times at their first occurrence
    (each once), skipped ones at the jump: compared with a minute-by-minute reference."""
    end = moment + timedelta(hours=6)
    assert ticks_between(Cron(expression, zone), moment, end) == _reference_ticks(
        expression, zone, moment, end
    )
