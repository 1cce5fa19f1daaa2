"""Shared hypothesis strategies: the one place tests draw runs, times and failures from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID
from zoneinfo import ZoneInfo

from hypothesis import strategies as st

from agentruns.domain.backoff import Backoff
from agentruns.domain.bands import Band
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

bands = st.sampled_from(list(Band))
states = st.sampled_from(list(AgentRunState))
workspaces = st.sampled_from(["ws-a", "ws-b", "ws-c", "ws-d"])
subjects = st.sampled_from([f"review:{n}" for n in range(8)])
offsets = st.integers(min_value=0, max_value=4 * 3600).map(lambda s: timedelta(seconds=s))
instants = offsets.map(lambda offset: EPOCH + offset)
agings = st.integers(min_value=1, max_value=3600).map(lambda s: timedelta(seconds=s))
attempts = st.integers(min_value=0, max_value=20)


@st.composite
def backoffs(draw: st.DrawFn) -> Backoff:
    base = draw(st.integers(min_value=0, max_value=120))
    cap = draw(st.integers(min_value=base, max_value=3600))
    return Backoff(
        base=timedelta(seconds=base),
        cap=timedelta(seconds=cap),
        multiplier=draw(st.floats(min_value=1.0, max_value=4.0)),
        jitter=draw(st.floats(min_value=0.0, max_value=1.0)),
    )


@st.composite
def runs(draw: st.DrawFn, seq: int, state: AgentRunState | None = None) -> AgentRun:
    chosen = draw(states) if state is None else state
    due = draw(instants)
    epoch = draw(st.integers(min_value=0, max_value=5))
    if chosen is AgentRunState.LEASED:
        epoch = max(epoch, 1)
    return AgentRun(
        id=UUID(int=seq + 1),
        kind="review",
        workspace=draw(workspaces),
        subject=draw(subjects),
        band=draw(bands),
        payload={},
        state=chosen,
        epoch=epoch,
        attempt=0,
        seq=seq,
        enqueued_at=EPOCH,
        due_at=due,
        leased_until=due + timedelta(minutes=5) if chosen is AgentRunState.LEASED else None,
        holder="worker" if chosen is AgentRunState.LEASED else None,
    )


@st.composite
def populations(draw: st.DrawFn, max_size: int = 30) -> list[AgentRun]:
    """Runs with unique ids and queue order, at most one LEASED per (workspace, subject)."""
    size = draw(st.integers(min_value=0, max_value=max_size))
    drawn = [draw(runs(seq)) for seq in range(size)]
    leased: set[tuple[str, str]] = set()
    population: list[AgentRun] = []
    for run in drawn:
        if run.state is AgentRunState.LEASED:
            if (run.workspace, run.subject) in leased:
                continue
            leased.add((run.workspace, run.subject))
        population.append(run)
    return population


# The stateful test of AgentRuns: few subjects and holders, so that runs contend for subjects and
# fences go stale often; clock steps around the contract kinds' 30 s lease, 10 s backoff and
# 30 min deadline.
contended_subjects = st.sampled_from(["review:1", "review:2", "review:3"])
holders = st.sampled_from(["worker-1", "worker-2"])
clock_steps = st.one_of(
    st.sampled_from([1, 10, 29, 30, 31, 60, 600]).map(lambda s: timedelta(seconds=s)),
    st.integers(min_value=0, max_value=90).map(lambda s: timedelta(seconds=s)),
)
short_delays = st.integers(min_value=0, max_value=90).map(lambda s: timedelta(seconds=s))
holder_end_reasons = st.sampled_from(
    [TerminationReason.COMPLETED, TerminationReason.FAILED, TerminationReason.NOT_RETRYABLE]
)


# Schedules: cron expressions a reference matcher can read (minute and hour fields only), zones
# with DST rules of every shape (an hour, half an hour, southern hemisphere, none), and instants
# over several years so every transition of those zones comes up.
schedule_zones = st.sampled_from(
    [
        "UTC",
        "Europe/Paris",
        "America/New_York",
        "Australia/Lord_Howe",
        "America/Santiago",
        "Asia/Kolkata",
    ]
)
minute_crons = st.sampled_from(
    [
        "* * * * *",
        "*/15 * * * *",
        "30 2 * * *",
        "0 2 * * *",
        "45 1,2,3 * * *",
        "0,30 * * * *",
        "15 */3 * * *",
        "0 0 * * *",
    ]
)
schedule_instants = st.datetimes(
    min_value=datetime(2024, 1, 1),
    max_value=datetime(2028, 12, 31),
    timezones=st.just(UTC),
)
intervals = st.one_of(
    st.sampled_from([1, 7, 60, 90, 3600, 86400]),
    st.integers(min_value=1, max_value=7 * 86400),
).map(lambda s: timedelta(seconds=s))


def _transitions(name: str, year: int = 2026) -> list[datetime]:
    """The instants (to the hour) in ``year`` when zone ``name`` changes its offset."""
    tz = ZoneInfo(name)
    found = []
    moment = datetime(year, 1, 1, tzinfo=UTC)
    offset = moment.astimezone(tz).utcoffset()
    while moment.year == year:
        moment += timedelta(hours=1)
        now_offset = moment.astimezone(tz).utcoffset()
        if now_offset != offset:
            found.append(moment)
            offset = now_offset
    return found


DST_TRANSITIONS = [
    moment
    for zone_name in ("Europe/Paris", "America/New_York", "Australia/Lord_Howe", "America/Santiago")
    for moment in _transitions(zone_name)
]
# Half the draws land within six hours of a transition of one of the zones.
near_transitions = st.tuples(
    st.sampled_from(DST_TRANSITIONS), st.integers(min_value=-6 * 3600, max_value=6 * 3600)
).map(lambda pair: pair[0] + timedelta(seconds=pair[1]))
schedule_moments = st.one_of(schedule_instants, near_transitions)
