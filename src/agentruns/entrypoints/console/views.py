"""What the console's pages show, computed from the read model: pure functions, no I/O.

- :func:`minute_chart`: the overview's per-minute chart as an SVG drawn on the server;
- :func:`epoch_timeline`: a run's epochs (claimed, failed or lost, taken back, requeued with
  backoff, ended) from the run, its events and its failure records;
- :func:`capped_json`: a payload or an event's data as pretty JSON, redacted (the rule of
  :mod:`agentruns.domain.redaction`, which the failure records follow too) and cut at a size;
- :func:`sorted_loads`: the workspaces page's order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any

from agentruns.app.overview import LOST_LEASE_CLASS, MinuteCounts, WorkspaceLoad, WorkspaceLoads
from agentruns.app.ports import RunEvent
from agentruns.domain.failure_records import FailureRecord
from agentruns.domain.payload import JsonValue
from agentruns.domain.redaction import redact_json
from agentruns.domain.run import AgentRun
from agentruns.domain.schedule import Schedule
from agentruns.domain.states import AgentRunState
from agentruns.domain.timing import zone

JSON_CAP = 4_000  # characters of pretty JSON shown for one payload before it is cut

SERIES_STYLE = {
    "claims": ("claims", "#2563eb"),
    "completions": ("completions", "#16a34a"),
    "requeues": ("requeues", "#d97706"),
    "dead_letters": ("dead letters", "#dc2626"),
    "lost_leases": ("lost leases", "#7c3aed"),
}


def duration(value: timedelta | None) -> str:
    """A short human duration: ``4.2s``, ``3.5m``, ``2.0h``, ``1.5d``."""
    if value is None:
        return "-"
    seconds = value.total_seconds()
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 120:
        return f"{sign}{seconds:.1f}s"
    if seconds < 7200:
        return f"{sign}{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{sign}{seconds / 3600:.1f}h"
    return f"{sign}{seconds / 86400:.1f}d"


def moment(value: datetime | None, timezone: str | None = None) -> str:
    """A time that says its zone: ``2026-12-02 06:00:00 UTC``, or with ``timezone`` (a
    schedule's own) the time there and its offset, ``2026-12-02 07:00:00 Europe/Paris (+01:00)``.
    Every time the console shows goes through here, so none is shown without its zone."""
    if value is None:
        return "-"
    if timezone is None or timezone == "UTC":
        return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    local = value.astimezone(zone(timezone))
    offset = local.utcoffset() or timedelta()
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    hours, rest = divmod(abs(minutes), 60)
    return f"{local:%Y-%m-%d %H:%M:%S} {timezone} ({sign}{hours:02d}:{rest:02d})"


def tick_moment(value: datetime | None, schedule: Schedule) -> str:
    """A schedule's tick in the zone its cron is read in (an interval's is UTC)."""
    return moment(value, schedule.timezone if schedule.cron is not None else None)


@dataclass(frozen=True, slots=True)
class CappedJson:
    text: str
    cut: int  # characters left out (0: the whole payload is shown)


def capped_json(value: JsonValue, cap: int = JSON_CAP) -> CappedJson:
    """``value`` as indented JSON, secret-keyed and credential-shaped values redacted, at most
    ``cap`` characters of it."""
    text = json.dumps(redact_json(value), indent=2, ensure_ascii=False, sort_keys=True)
    if len(text) <= cap:
        return CappedJson(text, 0)
    return CappedJson(text[:cap], len(text) - cap)


def minute_chart(minutes: Sequence[MinuteCounts], *, width: int = 720, height: int = 180) -> str:
    """The per-minute series as one SVG: a line per series over the window's minutes, the
    newest minute at the right, a grid with the peak value, and a legend. Only numbers and fixed
    labels go into it."""
    left, right, top, bottom = 36, 8, 10, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max((counts.value(name) for counts in minutes for name in SERIES_STYLE), default=0)
    ceiling = max(peak, 1)
    step = plot_w / max(len(minutes) - 1, 1)

    def x(index: int) -> float:
        return left + index * step

    def y(value: int) -> float:
        return top + plot_h - plot_h * value / ceiling

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'class="chart" role="img" aria-label="runs per minute">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="plot"/>',
    ]
    for fraction in (0.0, 0.5, 1.0):
        level = round(ceiling * fraction)
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(level):.1f}" y2="{y(level):.1f}" '
            f'class="grid"/><text x="{left - 4}" y="{y(level) + 4:.1f}" class="tick" '
            f'text-anchor="end">{level}</text>'
        )
    if minutes:
        first, last = minutes[0].minute, minutes[-1].minute
        parts.append(
            f'<text x="{left}" y="{height - 20}" class="tick">{first.astimezone(UTC):%H:%M}</text>'
            f'<text x="{left + plot_w}" y="{height - 20}" class="tick" '
            f'text-anchor="end">{last.astimezone(UTC):%H:%M} UTC</text>'
        )
    for name, (label, colour) in SERIES_STYLE.items():
        points = " ".join(
            f"{x(index):.1f},{y(counts.value(name)):.1f}" for index, counts in enumerate(minutes)
        )
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.8" '
            f'data-series="{name}"><title>{escape(label)}</title></polyline>'
        )
    for index, (label, colour) in enumerate(SERIES_STYLE.values()):
        at = left + index * (plot_w / len(SERIES_STYLE))
        parts.append(
            f'<rect x="{at:.1f}" y="{height - 12}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{at + 14:.1f}" y="{height - 3}" class="legend">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class EpochView:
    """What one epoch (one claim) of a run came to."""

    epoch: int
    claimed_at: datetime | None
    holder: str | None
    events: int
    first_event_at: datetime | None
    last_event_at: datetime | None
    failure: FailureRecord | None
    outcome: str  # "leased", "lost", "failed", "requeued", "ended"
    summary: str
    steps: list[str] = field(default_factory=list)


def epoch_timeline(
    run: AgentRun,
    events: Sequence[RunEvent],
    failures: Sequence[FailureRecord],
    now: datetime,
    *,
    first_epoch: int = 1,
) -> list[EpochView]:
    """The run's epochs from ``first_epoch`` (a continuation starts after the epochs of the run
    it continues) to its current one, oldest first. Only the current epoch's claim time and
    holder are kept on the run; an earlier epoch shows its events and its failure record."""
    failure_at = {record.epoch: record for record in failures}
    views: list[EpochView] = []
    for epoch in range(max(first_epoch, 1), run.epoch + 1):
        mine = [event for event in events if event.epoch == epoch]
        record = failure_at.get(epoch)
        current = epoch == run.epoch
        steps: list[str] = []
        claimed = run.claimed_at if current else None
        steps.append(f"claimed at {moment(claimed)}" if claimed else "claimed")
        if mine:
            steps.append(
                f"{len(mine)} step event{'s' if len(mine) != 1 else ''}, "
                f"{moment(mine[0].created_at)} to {moment(mine[-1].created_at)}"
                " (each renewed the lease)"
            )
        ended_here = current and run.state is AgentRunState.ENDED
        if record is not None and record.failure_class == LOST_LEASE_CLASS:
            outcome = "lost"
            steps.append(f"lease lost: taken back by the reaper at {moment(record.recorded_at)}")
        elif record is not None:
            outcome = "failed"
            steps.append(
                f"failed at {moment(record.recorded_at)}: {record.error_type}: {record.message}"
                f" ({record.failure_class})"
            )
        else:
            outcome = "leased" if current and run.state is AgentRunState.LEASED else "requeued"
        if ended_here:
            steps.append(f"ended {run.end_reason} at {moment(run.ended_at)}")
            outcome = "ended" if record is None else outcome
        elif current and run.state is AgentRunState.LEASED:
            steps.append(f"held by {run.holder}, lease until {moment(run.leased_until)}")
            if run.leased_until is not None and run.leased_until <= now:
                steps.append("the lease has expired: the reaper takes it back at its next tick")
        elif not current or run.state is AgentRunState.QUEUED:
            if record is None:
                steps.append("went back to the queue (no failure recorded)")
            elif current:
                backoff = run.due_at - record.recorded_at
                steps.append(f"requeued with backoff {duration(backoff)}: due {moment(run.due_at)}")
            else:
                steps.append("requeued with backoff")
        summary = steps[-1]
        views.append(
            EpochView(
                epoch=epoch,
                claimed_at=claimed,
                holder=run.holder if current else (record.holder if record else None),
                events=len(mine),
                first_event_at=mine[0].created_at if mine else None,
                last_event_at=mine[-1].created_at if mine else None,
                failure=record,
                outcome=outcome,
                summary=summary,
                steps=steps,
            )
        )
    return views


_SortKey = Callable[[WorkspaceLoad, "dict[str, Share]"], Any]

# How the workspaces page may be sorted ("oldest" is sorted apart: a workspace with nothing due
# has no age).
SORTS: dict[str, _SortKey] = {
    "workspace": lambda load, shares: load.workspace,
    "queued": lambda load, shares: load.queued_total,
    "interactive": lambda load, shares: load.queued[0],
    "batch": lambda load, shares: load.queued[1],
    "background": lambda load, shares: load.queued[2],
    "leased": lambda load, shares: load.leased,
    "waiting": lambda load, shares: load.waiting,
    "oldest": lambda load, shares: load.workspace,
    "share": lambda load, shares: shares[load.workspace].leased - shares[load.workspace].queued,
}


@dataclass(frozen=True, slots=True)
class Share:
    """A workspace's part of all leased and of all queued runs (0 to 1)."""

    leased: float
    queued: float


def shares(loads: WorkspaceLoads) -> dict[str, Share]:
    leased, queued = loads.leased, loads.queued
    return {
        load.workspace: Share(
            load.leased / leased if leased else 0.0,
            load.queued_total / queued if queued else 0.0,
        )
        for load in loads.loads
    }


def sorted_loads(
    loads: WorkspaceLoads, by: str, descending: bool, found: dict[str, Share]
) -> list[WorkspaceLoad]:
    """The workspaces in the order the page asks for (``by`` is a key of :data:`SORTS`)."""
    key = SORTS[by]
    if by == "oldest":
        # The oldest due first when ascending; workspaces with nothing due last either way.
        due = [load for load in loads.loads if load.oldest_due_at is not None]
        rest = [load for load in loads.loads if load.oldest_due_at is None]
        ordered = sorted(due, key=lambda load: (load.oldest_due_at, load.workspace))
        return [*(reversed(ordered) if descending else ordered), *rest]
    return sorted(
        sorted(loads.loads, key=lambda load: load.workspace),
        key=lambda load: key(load, found),
        reverse=descending,
    )
