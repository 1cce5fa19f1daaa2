"""The read model of runs: what an operator's ``status`` and the demo's invariant checks ask.

A port apart from :class:`~agentruns.app.ports.RunStore` because it only reads, answers for the
whole table rather than one run, and may be slower: nothing on the claim path calls it. Each
adapter family ships one (memory, PostgreSQL) and the contract suite holds them together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from agentruns.app.overview import Overview, WorkspaceLoads
from agentruns.app.ports import BudgetHold, Transaction
from agentruns.domain.bands import Band
from agentruns.domain.claim_order import SubjectKey
from agentruns.domain.holders import HeldLease, LeaseScan
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason


@dataclass(frozen=True, slots=True)
class RunCount:
    """How many runs share a state, band, workspace and end reason."""

    state: AgentRunState
    band: Band
    workspace: str
    end_reason: TerminationReason | None
    count: int


@dataclass(frozen=True, slots=True)
class ExpiredLeases:
    """Leases of one kind that have expired and not been taken back yet. When they stay
    expired for long, no reaper that registers their kind is running: they are orphaned."""

    kind: str
    count: int
    oldest_leased_until: datetime


@dataclass(frozen=True, slots=True)
class RunStatus:
    """The table at one moment (``now``, on the store's clock)."""

    now: datetime
    counts: tuple[RunCount, ...]
    expired_leases: int
    oldest_due_at: datetime | None
    holds: tuple[BudgetHold, ...]
    inactive: tuple[str, ...]
    expired_by_kind: tuple[ExpiredLeases, ...] = ()

    def orphaned(self, after: timedelta) -> tuple[ExpiredLeases, ...]:
        """Kinds whose oldest expired lease has waited longer than ``after`` for a reaper."""
        return tuple(
            leases
            for leases in self.expired_by_kind
            if self.now - leases.oldest_leased_until > after
        )

    def total(
        self,
        state: AgentRunState | None = None,
        *,
        workspace: str | None = None,
        band: Band | None = None,
        reason: TerminationReason | None = None,
    ) -> int:
        """Runs matching every filter given."""
        return sum(
            count.count
            for count in self.counts
            if (state is None or count.state is state)
            and (workspace is None or count.workspace == workspace)
            and (band is None or count.band is band)
            and (reason is None or count.end_reason is reason)
        )

    def workspaces(self) -> list[str]:
        return sorted({count.workspace for count in self.counts})

    def reasons(self) -> dict[TerminationReason, int]:
        found: dict[TerminationReason, int] = {}
        for count in self.counts:
            if count.end_reason is not None:
                found[count.end_reason] = found.get(count.end_reason, 0) + count.count
        return found

    @property
    def oldest_due_age(self) -> timedelta | None:
        """How long the oldest due queued run has waited since it became due."""
        return None if self.oldest_due_at is None else self.now - self.oldest_due_at

    @property
    def unavailable(self) -> frozenset[str]:
        """Workspaces whose runs are not offered now: inactive or under a budget hold."""
        return frozenset(self.inactive) | {hold.workspace for hold in self.holds}


def count_runs(runs: Iterable[AgentRun]) -> tuple[RunCount, ...]:
    """Group runs as :attr:`RunStatus.counts` does (for adapters that count in Python)."""
    groups: dict[tuple[AgentRunState, Band, str, TerminationReason | None], int] = {}
    for run in runs:
        key = (run.state, run.band, run.workspace, run.end_reason)
        groups[key] = groups.get(key, 0) + 1
    return tuple(
        RunCount(state, band, workspace, reason, count)
        for (state, band, workspace, reason), count in sorted(
            groups.items(), key=lambda item: (item[0][0], item[0][1], item[0][2], item[0][3] or "")
        )
    )


class RunStats(Protocol):
    """Read-only questions over all runs."""

    async def status(self, tx: Transaction) -> RunStatus: ...

    async def runs(
        self,
        tx: Transaction,
        *,
        state: AgentRunState | None = None,
        holder: str | None = None,
        limit: int = 100,
    ) -> list[AgentRun]:
        """Runs in queue order, filtered by state and holder."""
        ...

    async def ended_before(self, tx: Transaction, older_than: timedelta) -> int:
        """How many runs ended more than ``older_than`` ago (on the store's clock): what a
        purge with that retention would delete."""
        ...

    async def doubly_leased_subjects(self, tx: Transaction) -> list[SubjectKey]:
        """Subjects (workspace, subject) with more than one LEASED run: always empty, or an
        invariant broke."""
        ...

    async def unsettled(self, tx: Transaction) -> int:
        """Runs that are neither ENDED with a reason, QUEUED with a due time, nor LEASED with a
        lease expiry: always zero, or an invariant broke."""
        ...

    async def overview(
        self,
        tx: Transaction,
        *,
        window: timedelta,
        soon: timedelta,
        expiring: int = 20,
        waiting: int = 10,
    ) -> Overview:
        """Runs queued and leased now by band and kind, ended within ``window`` by band, kind
        and reason; per minute of the window, claims, completions, requeues, dead letters and
        lost leases; queue wait p50/p95 by band over the window's claims; the leases that
        expire within ``soon`` (the first ``expiring`` of them, soonest first, and how many);
        and the runs that wait (the first ``waiting`` of them, soonest end first, and how
        many). :mod:`agentruns.app.overview` says how each figure is derived."""
        ...

    async def held_leases(
        self, tx: Transaction, scan: LeaseScan, *, limit: int = 500
    ) -> list[HeldLease]:
        """Leased runs that may be quiet: renewed (``leased_until - lease``) before
        ``scan.renewed_before``, or held by a holder not in ``scan.live``; oldest renewal first
        (then queue order), at most ``limit``. The domain decides which are quiet."""
        ...

    async def queued_kinds(self, tx: Transaction) -> dict[str, int]:
        """Queued runs (due or not) by kind."""
        ...

    async def workspace_loads(self, tx: Transaction) -> WorkspaceLoads:
        """Per workspace: queued runs by band (and how many of them wait), leased runs, the
        oldest due run's due time, the active flag and the budget hold in force."""
        ...
