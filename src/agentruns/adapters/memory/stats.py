"""The read model over the memory runs table."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

from agentruns.adapters.memory.database import MemoryDatabase
from agentruns.adapters.memory.runs import MemoryRunStore
from agentruns.adapters.memory.workspaces import MemoryWorkspaceStore
from agentruns.app.ports import Clock, Transaction
from agentruns.app.stats import ExpiredLeases, RunStats, RunStatus, count_runs
from agentruns.domain.claim_order import SubjectKey, subject_key
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState


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
