"""What a scheduler does with a schedule, as pure functions of its state and ``now``.

A schedule's row keeps its definition, whether an operator paused it, whether the code still
declares it, and ``next_tick_at``: the first tick not yet decided. A scheduler pass that finds
it due asks :func:`plan_ticks` which ticks to enqueue (the catch-up policy applied) and where the
next one is; :func:`reconcile` says what syncing the declared schedules changes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from uuid import UUID

from agentruns.domain.schedule import CatchUp, Schedule, Schedules

_TICK = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A schedule as the table keeps it. ``next_tick_at`` is ``None`` when it never ticks
    again; a paused or removed schedule does not tick. ``created_at``, ``updated_at`` and
    ``removed_at`` record when a sync added it, when its definition or pause last changed, and
    when a sync found it no longer declared."""

    schedule: Schedule
    created_at: datetime
    updated_at: datetime
    next_tick_at: datetime | None
    paused: bool = False
    removed_at: datetime | None = None
    last_tick_at: datetime | None = None
    last_run: UUID | None = None

    @property
    def name(self) -> str:
        return self.schedule.name

    @property
    def active(self) -> bool:
        return not self.paused and self.removed_at is None

    def is_due(self, now: datetime) -> bool:
        return self.active and self.next_tick_at is not None and self.next_tick_at <= now


def added(schedule: Schedule, now: datetime) -> ScheduleState:
    """A newly declared schedule: its first tick is the first after ``now`` (nothing before
    it was ever due)."""
    return ScheduleState(schedule, now, now, schedule.next_after(now))


def redeclared(state: ScheduleState, schedule: Schedule, now: datetime) -> ScheduleState:
    """The stored schedule declared again as ``schedule``: a new timing (or a schedule that was
    removed) starts from the first tick after ``now``; otherwise the next tick stays."""
    next_tick = state.next_tick_at
    if state.removed_at is not None or not state.schedule.same_timing(schedule):
        next_tick = schedule.next_after(now)
    return replace(
        state, schedule=schedule, updated_at=now, next_tick_at=next_tick, removed_at=None
    )


def removed(state: ScheduleState, now: datetime) -> ScheduleState:
    """No longer declared: kept for its history, ticks no more."""
    return replace(state, removed_at=now, updated_at=now)


def paused(state: ScheduleState, now: datetime) -> ScheduleState:
    return replace(state, paused=True, updated_at=now)


def resumed(state: ScheduleState, now: datetime) -> ScheduleState:
    """Ticks again from the first tick after ``now``: what fell due while paused is not caught
    up (a pause means "not now")."""
    next_tick = state.schedule.next_after(now)
    return replace(state, paused=False, updated_at=now, next_tick_at=next_tick)


@dataclass(frozen=True, slots=True)
class TickPlan:
    """A pass's decision: the ticks to enqueue (oldest first), the span ``[start, end)`` of due
    ticks the catch-up policy skipped (``None``: none), and the next tick after ``now``."""

    ticks: tuple[datetime, ...]
    next_tick_at: datetime | None
    skipped: tuple[datetime, datetime] | None = None


def fired(
    state: ScheduleState, plan: TickPlan, last: tuple[datetime, UUID] | None
) -> ScheduleState:
    """The state after a pass carried ``plan`` out; ``last`` is its newest tick and run.
    (``updated_at`` is left alone: it says when the definition or the pause last changed.)"""
    changed = replace(state, next_tick_at=plan.next_tick_at)
    if last is None:
        return changed
    return replace(changed, last_tick_at=last[0], last_run=last[1])


def plan_ticks(schedule: Schedule, pending: datetime | None, now: datetime) -> TickPlan:
    """Which due ticks from ``pending`` (the first undecided one) up to ``now`` to enqueue.

    A tick seen within ``schedule.grace`` of its time is on time: always enqueued. Older ones
    were missed: ``latest`` enqueues the most recent missed tick only when no tick is on time,
    ``all`` the most recent ``catch_up_limit`` missed ticks, ``none`` none of them.
    """
    if pending is None or pending > now:
        return TickPlan((), pending)
    on_time_from = max(pending, now - schedule.grace)
    on_time: list[datetime] = []
    tick = _first_at_or_after(schedule, on_time_from)
    while tick is not None and tick <= now:
        on_time.append(tick)
        tick = schedule.next_after(tick)
    next_tick = tick  # the first tick after now

    latest_missed = _last_before(schedule, on_time_from, pending)
    if latest_missed is None:
        return TickPlan(tuple(on_time), next_tick)
    kept: list[datetime] = []
    match schedule.catch_up:
        case CatchUp.ALL:
            missed: datetime | None = latest_missed
            while missed is not None and len(kept) < schedule.catch_up_limit:
                kept.append(missed)
                missed = _last_before(schedule, missed, pending)
            kept.reverse()
        case CatchUp.LATEST:
            if not on_time:
                kept.append(latest_missed)
        case CatchUp.NONE:
            pass
    skipped_end = kept[0] if kept else (on_time[0] if on_time else on_time_from)
    skipped = _span(schedule, pending, skipped_end)
    return TickPlan(tuple(kept + on_time), next_tick, skipped)


def _first_at_or_after(schedule: Schedule, moment: datetime) -> datetime | None:
    return schedule.next_after(moment - _TICK)


def _last_before(schedule: Schedule, moment: datetime, floor: datetime) -> datetime | None:
    """The last tick strictly before ``moment`` and not before ``floor``."""
    tick = schedule.last_at_or_before(moment - _TICK)
    return tick if tick is not None and tick >= floor else None


def _span(schedule: Schedule, start: datetime, end: datetime) -> tuple[datetime, datetime] | None:
    """``(start, end)`` if some tick falls in ``[start, end)``."""
    return (start, end) if _last_before(schedule, end, start) is not None else None


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """What syncing the declared schedules writes: rows to add, change and mark removed."""

    added: list[ScheduleState] = field(default_factory=list)
    changed: list[ScheduleState] = field(default_factory=list)
    removed: list[ScheduleState] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def writes(self) -> list[ScheduleState]:
        return [*self.added, *self.changed, *self.removed]


def reconcile(
    declared: Schedules,
    stored: Sequence[ScheduleState],
    owned_kinds: Collection[str],
    now: datetime,
) -> SyncPlan:
    """Bring the table in line with the declared schedules.

    A process owns the schedules of the kinds it registers: a stored schedule of one of those
    kinds that is no longer declared is marked removed; one of another kind is left alone (a
    worker pool that runs other kinds declares it). A removed schedule declared again is added
    back, and starts from the first tick after ``now``.
    """
    plan = SyncPlan()
    by_name = {state.name: state for state in stored}
    for schedule in declared:
        state = by_name.get(schedule.name)
        if state is None:
            plan.added.append(added(schedule, now))
        elif state.removed_at is not None:
            plan.added.append(redeclared(state, schedule, now))
        elif state.schedule != schedule:
            plan.changed.append(redeclared(state, schedule, now))
        else:
            plan.unchanged.append(schedule.name)
    for state in stored:
        if (
            state.name not in declared
            and state.removed_at is None
            and state.schedule.kind in owned_kinds
        ):
            plan.removed.append(removed(state, now))
    return plan
