"""The read model over the memory runs table."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from uuid import UUID

from agentruns.adapters.memory.database import MemoryDatabase
from agentruns.adapters.memory.runs import MemoryRunStore
from agentruns.adapters.memory.workspaces import MemoryWorkspaceStore
from agentruns.app.overview import (
    LOST_LEASE_CLASS,
    EndedCount,
    ExpiringLease,
    LiveCount,
    MinuteCounts,
    Overview,
    QueueWait,
    WaitingRun,
    WorkspaceLoad,
    WorkspaceLoads,
    fill_minutes,
    minute_of,
    minutes_of,
    percentile,
)
from agentruns.app.ports import Clock, Transaction
from agentruns.app.stats import ExpiredLeases, RunStats, RunStatus, count_runs
from agentruns.domain.bands import Band
from agentruns.domain.claim_order import SubjectKey, subject_key
from agentruns.domain.holders import HeldLease, LeaseScan
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from agentruns.domain.waits import is_waiting


class MemoryRunStats(RunStats):
    def __init__(
        self,
        database: MemoryDatabase,
        runs: MemoryRunStore,
        workspaces: MemoryWorkspaceStore,
        clock: Clock,
    ) -> None:
        self._database = database
        self._runs = runs
        self._workspaces = workspaces
        self._clock = clock

    def _all(self, tx: Transaction) -> list[AgentRun]:
        self._database.check(tx)
        return sorted(self._runs.rows.values(), key=lambda run: run.seq)

    async def status(self, tx: Transaction) -> RunStatus:
        everything = self._all(tx)
        now = self._clock.now()
        due = [
            run.due_at
            for run in everything
            if run.state is AgentRunState.QUEUED and run.due_at <= now
        ]
        return RunStatus(
            now=now,
            counts=count_runs(everything),
            expired_leases=sum(1 for run in everything if run.is_expired(now)),
            oldest_due_at=min(due) if due else None,
            holds=tuple(self._workspaces.holds_at(now)),
            inactive=tuple(self._workspaces.inactive()),
            expired_by_kind=_expired_by_kind(everything, now),
        )

    async def ended_before(self, tx: Transaction, older_than: timedelta) -> int:
        cutoff = self._clock.now() - older_than
        return sum(
            1
            for run in self._all(tx)
            if run.state is AgentRunState.ENDED
            and run.ended_at is not None
            and run.ended_at < cutoff
        )

    async def runs(
        self,
        tx: Transaction,
        *,
        state: AgentRunState | None = None,
        holder: str | None = None,
        limit: int = 100,
    ) -> list[AgentRun]:
        return [
            run
            for run in self._all(tx)
            if (state is None or run.state is state) and (holder is None or run.holder == holder)
        ][:limit]

    async def doubly_leased_subjects(self, tx: Transaction) -> list[SubjectKey]:
        leased = Counter(
            subject_key(run) for run in self._all(tx) if run.state is AgentRunState.LEASED
        )
        return sorted(subject for subject, count in leased.items() if count > 1)

    async def unsettled(self, tx: Transaction) -> int:
        return sum(1 for run in self._all(tx) if not _settled(run))

    async def held_leases(
        self, tx: Transaction, scan: LeaseScan, *, limit: int = 500
    ) -> list[HeldLease]:
        leases = [held for run in self._all(tx) if (held := _held(run)) is not None]
        found = [
            (lease, seq)
            for lease, seq in leases
            if lease.renewed_at < scan.renewed_before or lease.holder not in scan.live
        ]
        found.sort(key=lambda pair: (pair[0].renewed_at, pair[1]))
        return [lease for lease, _ in found[:limit]]

    async def queued_kinds(self, tx: Transaction) -> dict[str, int]:
        counted = Counter(run.kind for run in self._all(tx) if run.state is AgentRunState.QUEUED)
        return dict(sorted(counted.items()))

    async def overview(
        self,
        tx: Transaction,
        *,
        window: timedelta,
        soon: timedelta,
        expiring: int = 20,
        waiting: int = 10,
    ) -> Overview:
        everything = self._all(tx)
        now = self._clock.now()
        since = minutes_of(now, window)[0]
        live = Counter(
            (run.state, run.band, run.kind)
            for run in everything
            if run.state is not AgentRunState.ENDED
        )
        ended = [
            run
            for run in everything
            if run.state is AgentRunState.ENDED and run.ended_at and run.ended_at >= since
        ]
        minutes: dict[datetime, Counter[str]] = {}

        def count(moment: datetime, series: str) -> None:
            minutes.setdefault(minute_of(moment), Counter())[series] += 1

        for run in ended:
            if run.ended_at is None or run.end_reason is None:
                continue
            if run.end_reason is TerminationReason.COMPLETED:
                count(run.ended_at, "completions")
            elif run.end_reason.is_dead_letter:
                count(run.ended_at, "dead_letters")
        ended_ids = {run.id for run in ended}
        by_id = {run.id: run for run in everything}
        requeued_in_window: set[UUID] = set()
        for record in self._runs.all_failures():
            if record.recorded_at < since:
                continue
            run = by_id[record.run_id]
            if record.failure_class == LOST_LEASE_CLASS:
                count(record.recorded_at, "lost_leases")
            if not (run.state is AgentRunState.ENDED and run.epoch == record.epoch):
                count(record.recorded_at, "requeues")
                requeued_in_window.add(run.id)
        waits: dict[Band, list[float]] = {}
        for run in everything:
            if run.claimed_at is None or run.claimed_at < since:
                continue
            leased = run.state is AgentRunState.LEASED
            if leased or run.id in ended_ids or run.id in requeued_in_window:
                count(run.claimed_at, "claims")
            if leased or run.state is AgentRunState.ENDED:
                wait = (run.claimed_at - run.due_at).total_seconds()
                waits.setdefault(run.band, []).append(max(wait, 0.0))
        leases = sorted(
            (
                run
                for run in everything
                if run.state is AgentRunState.LEASED
                and run.leased_until is not None
                and run.leased_until <= now + soon
            ),
            key=lambda run: (run.leased_until, run.seq),
        )
        waits_now = sorted(
            (run for run in everything if is_waiting(run)),
            key=lambda run: (run.waiting_until, run.seq),
        )
        return Overview(
            now=now,
            window=window,
            live=tuple(
                LiveCount(state, band, kind, total)
                for (state, band, kind), total in sorted(live.items())
            ),
            ended=tuple(
                EndedCount(band, kind, reason, total)
                for (band, kind, reason), total in sorted(
                    Counter(
                        (run.band, run.kind, run.end_reason)
                        for run in ended
                        if run.end_reason is not None
                    ).items()
                )
            ),
            minutes=fill_minutes(
                now,
                window,
                (
                    MinuteCounts(minute, **{name: found[name] for name in MinuteCounts.SERIES})
                    for minute, found in minutes.items()
                ),
            ),
            waits=tuple(
                QueueWait(
                    band,
                    len(waits.get(band, [])),
                    _seconds(percentile(waits.get(band, []), 0.5)),
                    _seconds(percentile(waits.get(band, []), 0.95)),
                )
                for band in Band
            ),
            expiring=tuple(
                ExpiringLease(
                    run.id,
                    run.kind,
                    run.workspace,
                    run.subject,
                    run.holder,
                    run.epoch,
                    run.leased_until,
                )
                for run in leases[:expiring]
                if run.leased_until is not None
            ),
            expiring_total=len(leases),
            soon=soon,
            expired_by_kind=_expired_by_kind(everything, now),
            waiting=tuple(
                WaitingRun(
                    run.id,
                    run.kind,
                    run.workspace,
                    run.subject,
                    run.waiting_for,
                    run.waiting_until,
                    run.waiting_since,
                )
                for run in waits_now[:waiting]
                if run.waiting_until is not None
            ),
            waiting_total=len(waits_now),
        )

    async def workspace_loads(self, tx: Transaction) -> WorkspaceLoads:
        everything = self._all(tx)
        now = self._clock.now()
        holds = {hold.workspace: hold for hold in self._workspaces.holds_at(now)}
        inactive = set(self._workspaces.inactive())
        queued: dict[str, list[int]] = {}
        leased: Counter[str] = Counter()
        waiting: Counter[str] = Counter()
        oldest: dict[str, datetime] = {}
        for run in everything:
            if is_waiting(run):
                waiting[run.workspace] += 1
            if run.state is AgentRunState.QUEUED:
                queued.setdefault(run.workspace, [0, 0, 0])[int(run.band)] += 1
                if run.due_at <= now:
                    held = oldest.get(run.workspace)
                    oldest[run.workspace] = run.due_at if held is None else min(held, run.due_at)
            elif run.state is AgentRunState.LEASED:
                leased[run.workspace] += 1
        names = sorted(set(queued) | set(leased) | inactive | set(holds))
        return WorkspaceLoads(
            now=now,
            loads=tuple(
                WorkspaceLoad(
                    workspace=name,
                    queued=_bands(queued.get(name, [0, 0, 0])),
                    leased=leased[name],
                    oldest_due_at=oldest.get(name),
                    active=name not in inactive,
                    hold=holds.get(name),
                    waiting=waiting[name],
                )
                for name in names
            ),
        )


def _bands(counts: list[int]) -> tuple[int, int, int]:
    return (counts[0], counts[1], counts[2])


def _seconds(value: float | None) -> timedelta | None:
    return None if value is None else timedelta(seconds=value)


def _settled(run: AgentRun) -> bool:
    match run.state:
        case AgentRunState.ENDED:
            return run.end_reason is not None
        case AgentRunState.QUEUED:
            return run.due_at is not None
        case AgentRunState.LEASED:
            return run.leased_until is not None


def _expired_by_kind(runs: list[AgentRun], now: datetime) -> tuple[ExpiredLeases, ...]:
    oldest: dict[str, datetime] = {}
    counted: Counter[str] = Counter()
    for run in runs:
        if run.is_expired(now) and run.leased_until is not None:
            counted[run.kind] += 1
            held = oldest.get(run.kind)
            oldest[run.kind] = run.leased_until if held is None else min(held, run.leased_until)
    return tuple(ExpiredLeases(kind, counted[kind], oldest[kind]) for kind in sorted(counted))


def _held(run: AgentRun) -> tuple[HeldLease, int] | None:
    """A leased run as the holders' view reads it, with its queue order; None if not leased."""
    if run.state is not AgentRunState.LEASED or run.leased_until is None:
        return None
    lease = HeldLease(
        run.id,
        run.kind,
        run.workspace,
        run.subject,
        run.holder,
        run.epoch,
        run.leased_until,
        run.lease,
    )
    return lease, run.seq
