"""The ``agent_sandbox`` table in memory: the domain's sandbox transitions applied to a dict.

It reads the memory run store's rows for the idle rule (a subject with a queued or leased run
is not idle), as the PostgreSQL statement reads ``agent_run`` in the same statement.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from agentruns.adapters.memory.database import MemoryDatabase, MemoryTable
from agentruns.adapters.memory.runs import MemoryRunStore
from agentruns.app.ports import Clock, Transaction
from agentruns.app.sandbox_ports import SandboxStore
from agentruns.domain.errors import IllegalTransition, SandboxNotLive
from agentruns.domain.sandbox import (
    AgentSandbox,
    SandboxState,
    SandboxTimings,
    mark_deleting,
    mark_ready,
    mark_used,
    take_back_cause,
    usable,
)
from agentruns.domain.states import AgentRunState

_WORKING = frozenset({AgentRunState.QUEUED, AgentRunState.LEASED})


class MemorySandboxStore(SandboxStore):
    def __init__(self, database: MemoryDatabase, clock: Clock, runs: MemoryRunStore) -> None:
        self._database = database
        self._clock = clock
        self._runs = runs
        self.rows: MemoryTable[UUID, AgentSandbox] = MemoryTable(database)

    async def now(self, tx: Transaction) -> datetime:
        self._database.check(tx)
        return self._clock.now()

    def _live_of_subject(self, workspace: str, subject: str) -> AgentSandbox | None:
        for sandbox in self.rows.values():
            if sandbox.workspace == workspace and sandbox.subject == subject and sandbox.is_live:
                return sandbox
        return None

    def _live(self, sandbox_id: UUID) -> AgentSandbox:
        sandbox = self.rows.get(sandbox_id)
        if sandbox is None or not sandbox.is_live:
            raise SandboxNotLive(f"sandbox {sandbox_id} is not live")
        return sandbox

    async def insert(self, tx: Transaction, sandbox: AgentSandbox) -> AgentSandbox | None:
        self._database.check(tx)
        if sandbox.state is not SandboxState.REQUESTED:
            raise IllegalTransition(None, sandbox.state, "a sandbox starts REQUESTED")
        if sandbox.id in {row.id for row in self.rows.values()}:
            raise IllegalTransition(None, sandbox.state, f"sandbox {sandbox.id} exists")
        if self._live_of_subject(sandbox.workspace, sandbox.subject) is not None:
            return None
        self.rows.put(tx, sandbox.id, sandbox)
        return sandbox

    async def get(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox | None:
        self._database.check(tx)
        return self.rows.get(sandbox_id)

    async def live_of_subject(
        self, tx: Transaction, workspace: str, subject: str
    ) -> AgentSandbox | None:
        self._database.check(tx)
        return self._live_of_subject(workspace, subject)

    async def lock_live(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox | None:
        self._database.check(tx)
        sandbox = self.rows.get(sandbox_id)
        if sandbox is None or not usable(sandbox, self._clock.now()):
            return None
        return sandbox

    async def mark_ready(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox:
        self._database.check(tx)
        before = self._live(sandbox_id)
        after = mark_ready(before, self._clock.now())
        if after is not before:
            self.rows.put(tx, sandbox_id, after)
        return after

    async def touch(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox:
        self._database.check(tx)
        after = mark_used(self._live(sandbox_id), self._clock.now())
        self.rows.put(tx, sandbox_id, after)
        return after

    async def take_back(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox | None:
        self._database.check(tx)
        sandbox = self.rows.get(sandbox_id)
        if sandbox is None or not sandbox.is_live:
            return None
        after = mark_deleting(sandbox)
        self.rows.put(tx, sandbox_id, after)
        return after

    async def take_back_due(
        self, tx: Transaction, timings: SandboxTimings, limit: int
    ) -> list[AgentSandbox]:
        self._database.check(tx)
        now = self._clock.now()
        working = {
            (run.workspace, run.subject)
            for run in self._runs.rows.values()
            if run.state in _WORKING
        }
        taken: list[AgentSandbox] = []
        for sandbox in sorted(self.rows.values(), key=lambda row: row.requested_at):
            if len(taken) >= limit:
                break
            cause = take_back_cause(
                sandbox,
                now,
                timings,
                subject_has_work=(sandbox.workspace, sandbox.subject) in working,
            )
            if cause is not None:
                after = mark_deleting(sandbox)
                self.rows.put(tx, sandbox.id, after)
                taken.append(after)
        return taken

    async def deleting(self, tx: Transaction, limit: int) -> list[AgentSandbox]:
        self._database.check(tx)
        rows = [row for row in self.rows.values() if row.state is SandboxState.DELETING]
        return sorted(rows, key=lambda row: row.requested_at)[:limit]

    async def listing(self, tx: Transaction, limit: int) -> list[AgentSandbox]:
        self._database.check(tx)
        rows = sorted(self.rows.values(), key=lambda row: (row.requested_at, str(row.id)))
        rows.sort(key=lambda row: row.requested_at, reverse=True)
        rows.sort(key=lambda row: row.state is SandboxState.DELETING)
        return rows[:limit]

    async def delete(self, tx: Transaction, sandbox_id: UUID) -> None:
        self._database.check(tx)
        sandbox = self.rows.get(sandbox_id)
        if sandbox is None:
            return
        if sandbox.state is not SandboxState.DELETING:
            raise IllegalTransition(sandbox.state, None, "only a DELETING sandbox is deleted")
        self.rows.delete(tx, sandbox_id)

    async def claim_names(self, tx: Transaction, names: list[str]) -> set[str]:
        self._database.check(tx)
        named = {row.claim_name for row in self.rows.values()}
        return {name for name in names if name in named}
