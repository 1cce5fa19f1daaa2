"""What the console shows at a glance: the read model of the overview and the workspaces page.

Both are answered by :class:`~agentruns.app.stats.RunStats` (memory and PostgreSQL, held together
by the contract suite) from what the runs table and the failure records keep; nothing here is on
the claim path. How each figure is derived (ADRs/0018):

- *claims* in a minute: runs whose current epoch was claimed then (``claimed_at``), among the
  runs leased now, ended within the window, or queued again after a failure recorded within it.
  A run claimed twice within the window counts once, at its latest claim.
- *completions* and *dead letters*: runs that ended in the minute COMPLETED, or with a
  dead-letter reason.
- *requeues*: failed attempts recorded in the minute whose run did not end at that epoch (the
  holder's charged requeue, its uncharged give-back of a run whose kind it does not know, or the
  reaper's take-back that queued the run again). A requeue that records no failure (a host's
  own) is not counted.
- *lost leases*: take-backs by the reaper (failure class ``lease_expired``) in the minute.
- *queue wait*: ``claimed_at - due_at`` of the runs claimed within the window that are leased now
  or have ended (a requeue moves ``due_at``, so a queued run's last wait is gone).
- *waiting*: queued runs that wait (:func:`agentruns.domain.waits.is_waiting`), counted, and the
  few whose wait ends soonest. When a run began to wait is not kept (nothing records the park's
  time), so what is shown is what it waits for and until when.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from uuid import UUID

from agentruns.app.ports import BudgetHold
from agentruns.domain.bands import Band
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason

if TYPE_CHECKING:
    from agentruns.app.stats import ExpiredLeases

#: The failure class of a reaper's take-back (``FailureClass.LEASE_EXPIRED``).
LOST_LEASE_CLASS = "lease_expired"


@dataclass(frozen=True, slots=True)
class LiveCount:
    """How many runs are QUEUED or LEASED now, of one band and kind."""

    state: AgentRunState
    band: Band
    kind: str
    count: int


@dataclass(frozen=True, slots=True)
class EndedCount:
    """How many runs of one band and kind ended with ``reason`` within the window."""

    band: Band
    kind: str
    reason: TerminationReason
    count: int


@dataclass(frozen=True, slots=True)
class MinuteCounts:
    """What happened in the minute that starts at ``minute``."""

    minute: datetime
    claims: int = 0
    completions: int = 0
    requeues: int = 0
    dead_letters: int = 0
    lost_leases: int = 0

    SERIES = ("claims", "completions", "requeues", "dead_letters", "lost_leases")

    def value(self, series: str) -> int:
        if series not in self.SERIES:
            raise ValueError(f"no series {series!r}")
        found: int = getattr(self, series)
        return found


@dataclass(frozen=True, slots=True)
class QueueWait:
    """How long the runs of a band waited from due to claim, over the claims of the window."""

    band: Band
    claims: int
    p50: timedelta | None
    p95: timedelta | None


@dataclass(frozen=True, slots=True)
class ExpiringLease:
    """A leased run whose lease runs out soon (or has run out) unless its holder renews."""

    run_id: UUID
    kind: str
    workspace: str
    subject: str
    holder: str | None
    epoch: int
    leased_until: datetime


@dataclass(frozen=True, slots=True)
class WaitingRun:
    """A run that waits: for the signal ``waiting_for`` (``None``: asleep) since
    ``waiting_since`` until ``waiting_until``, when its wait times out (a sleep ends)."""

    run_id: UUID
    kind: str
    workspace: str
    subject: str
    waiting_for: str | None
    waiting_until: datetime
    waiting_since: datetime | None = None


@dataclass(frozen=True, slots=True)
class Overview:
    """The runs table at ``now`` (the store's clock) and over the ``window`` before it."""

    now: datetime
    window: timedelta
    live: tuple[LiveCount, ...]
    ended: tuple[EndedCount, ...]
    minutes: tuple[MinuteCounts, ...]
    waits: tuple[QueueWait, ...]
    expiring: tuple[ExpiringLease, ...]
    expiring_total: int
    soon: timedelta
    expired_by_kind: tuple[ExpiredLeases, ...] = ()
    # The runs that wait, soonest end first (the first few), and how many wait in all.
    waiting: tuple[WaitingRun, ...] = ()
    waiting_total: int = 0

    def orphaned(self, after: timedelta) -> tuple[ExpiredLeases, ...]:
        """Kinds whose oldest expired lease has waited longer than ``after`` for a reaper (as
        :meth:`RunStatus.orphaned <agentruns.app.stats.RunStatus.orphaned>`)."""
        return tuple(
            leases
            for leases in self.expired_by_kind
            if self.now - leases.oldest_leased_until > after
        )

    def total(
        self,
        state: AgentRunState,
        *,
        band: Band | None = None,
        kind: str | None = None,
    ) -> int:
        """Runs in ``state`` now (QUEUED or LEASED), or ended within the window (ENDED)."""
        if state is AgentRunState.ENDED:
            return sum(
                count.count
                for count in self.ended
                if (band is None or count.band is band) and (kind is None or count.kind == kind)
            )
        return sum(
            count.count
            for count in self.live
            if count.state is state
            and (band is None or count.band is band)
            and (kind is None or count.kind == kind)
        )

    def kinds(self) -> list[str]:
        return sorted({count.kind for count in self.live} | {count.kind for count in self.ended})

    def reasons(self) -> dict[TerminationReason, int]:
        found: dict[TerminationReason, int] = {}
        for count in self.ended:
            found[count.reason] = found.get(count.reason, 0) + count.count
        return dict(sorted(found.items()))


@dataclass(frozen=True, slots=True)
class WorkspaceLoad:
    """One workspace as the claim sees it: its queued runs by band (INTERACTIVE, BATCH,
    BACKGROUND), its leased runs, when its oldest due run became due, whether it is active,
    and its budget hold (if one is in force)."""

    workspace: str
    queued: tuple[int, int, int]
    leased: int
    oldest_due_at: datetime | None
    active: bool = True
    hold: BudgetHold | None = None
    # Of its queued runs, those that wait (for a signal, or asleep).
    waiting: int = 0

    @property
    def queued_total(self) -> int:
        return sum(self.queued)

    @property
    def offered(self) -> bool:
        """Whether its runs are offered to claims now."""
        return self.active and self.hold is None


@dataclass(frozen=True, slots=True)
class WorkspaceLoads:
    """Every workspace with queued or leased runs, or that was written (inactive, held)."""

    now: datetime
    loads: tuple[WorkspaceLoad, ...] = field(default=())

    @property
    def queued(self) -> int:
        return sum(load.queued_total for load in self.loads)

    @property
    def leased(self) -> int:
        return sum(load.leased for load in self.loads)

    @property
    def waiting(self) -> int:
        return sum(load.waiting for load in self.loads)


def minute_of(moment: datetime) -> datetime:
    """The start of the minute ``moment`` falls in."""
    return moment.replace(second=0, microsecond=0)


def minutes_of(now: datetime, window: timedelta) -> list[datetime]:
    """The minutes of the window ending at ``now``, oldest first (the current one last)."""
    last = minute_of(now)
    count = max(1, math.ceil(window / timedelta(minutes=1)))
    return [last - timedelta(minutes=back) for back in range(count - 1, -1, -1)]


def fill_minutes(
    now: datetime, window: timedelta, found: Iterable[MinuteCounts]
) -> tuple[MinuteCounts, ...]:
    """One entry per minute of the window, zeros where nothing happened."""
    by_minute = {counts.minute: counts for counts in found}
    return tuple(by_minute.get(minute, MinuteCounts(minute)) for minute in minutes_of(now, window))


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The ``fraction`` quantile of ``values`` with linear interpolation between the closest
    ranks (PostgreSQL's ``percentile_cont``); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
