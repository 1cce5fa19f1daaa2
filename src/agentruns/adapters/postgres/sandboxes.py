"""The ``agent_sandbox`` table on PostgreSQL: guarded statements from
:mod:`~agentruns.adapters.postgres.sandbox_sql`, the same errors as the memory store."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import TextClause

from agentruns.adapters.postgres import sandbox_sql as sql
from agentruns.adapters.postgres.database import PostgresDatabase, Row, execute, fetch
from agentruns.adapters.postgres.sql import NOW_SELECT
from agentruns.app.ports import Transaction
from agentruns.app.sandbox_ports import SandboxStore
from agentruns.domain.errors import IllegalTransition, SandboxNotLive
from agentruns.domain.sandbox import AgentSandbox, SandboxState, SandboxTimings


def sandbox_from_row(row: Row) -> AgentSandbox:
    return AgentSandbox(
        id=row["id"],
        kind=row["kind"],
        workspace=row["workspace"],
        subject=row["subject"],
        state=SandboxState(row["state"]),
        requested_at=row["requested_at"],
        shutdown_at=row["shutdown_at"],
        claim_name=row["claim_name"],
        conversation=row["conversation"],
        ready_at=row["ready_at"],
        last_used_at=row["last_used_at"],
    )


class PostgresSandboxStore(SandboxStore):
    def __init__(self, database: PostgresDatabase) -> None:
        self._db = database

    def _params(self, **params: Any) -> Mapping[str, Any]:
        return {"now": self._db.now_param(), **params}

    async def _one(
        self, tx: Transaction, statement: TextClause, **params: Any
    ) -> AgentSandbox | None:
        rows = await fetch(tx, statement, self._params(**params))
        return sandbox_from_row(rows[0]) if rows else None

    async def now(self, tx: Transaction) -> datetime:
        rows = await fetch(tx, NOW_SELECT, self._params())
        now: datetime = rows[0]["now"]
        return now

    async def insert(self, tx: Transaction, sandbox: AgentSandbox) -> AgentSandbox | None:
        if sandbox.state is not SandboxState.REQUESTED:
            raise IllegalTransition(None, sandbox.state, "a sandbox starts REQUESTED")
        return await self._one(
            tx,
            sql.INSERT,
            id=sandbox.id,
            kind=sandbox.kind,
            workspace=sandbox.workspace,
            subject=sandbox.subject,
            requested_at=sandbox.requested_at,
            shutdown_at=sandbox.shutdown_at,
            claim_name=sandbox.claim_name,
            conversation=sandbox.conversation,
        )

    async def get(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox | None:
        return await self._one(tx, sql.GET, id=sandbox_id)

    async def live_of_subject(
        self, tx: Transaction, workspace: str, subject: str
    ) -> AgentSandbox | None:
        return await self._one(tx, sql.LIVE_OF_SUBJECT, workspace=workspace, subject=subject)

    async def lock_live(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox | None:
        return await self._one(tx, sql.LOCK_LIVE, id=sandbox_id)

    async def mark_ready(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox:
        ready = await self._one(tx, sql.MARK_READY, id=sandbox_id)
        if ready is not None:
            return ready
        current = await self.get(tx, sandbox_id)
        if current is not None and current.state is SandboxState.READY:
            return current
        raise SandboxNotLive(f"sandbox {sandbox_id} is not live")

    async def touch(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox:
        touched = await self._one(tx, sql.TOUCH, id=sandbox_id)
        if touched is None:
            raise SandboxNotLive(f"sandbox {sandbox_id} is not live")
        return touched

    async def take_back(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox | None:
        return await self._one(tx, sql.TAKE_BACK, id=sandbox_id)

    async def take_back_due(
        self, tx: Transaction, timings: SandboxTimings, limit: int
    ) -> list[AgentSandbox]:
        rows = await fetch(
            tx,
            sql.TAKE_BACK_DUE,
            self._params(
                start=timings.start,
                idle=timings.idle,
                conversation_idle=timings.conversation_idle,
                limit=limit,
            ),
        )
        return sorted((sandbox_from_row(row) for row in rows), key=lambda s: s.requested_at)

    async def deleting(self, tx: Transaction, limit: int) -> list[AgentSandbox]:
        rows = await fetch(tx, sql.DELETING, {"limit": limit})
        return [sandbox_from_row(row) for row in rows]

    async def listing(self, tx: Transaction, limit: int) -> list[AgentSandbox]:
        rows = await fetch(tx, sql.LISTING, {"limit": limit})
        return [sandbox_from_row(row) for row in rows]

    async def delete(self, tx: Transaction, sandbox_id: UUID) -> None:
        if await execute(tx, sql.DELETE, {"id": sandbox_id}):
            return
        current = await self.get(tx, sandbox_id)
        if current is not None:
            raise IllegalTransition(current.state, None, "only a DELETING sandbox is deleted")

    async def claim_names(self, tx: Transaction, names: list[str]) -> set[str]:
        if not names:
            return set()
        rows = await fetch(tx, sql.CLAIM_NAMES, {"names": names})
        return {row["claim_name"] for row in rows}
