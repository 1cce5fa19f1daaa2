"""The triage kind: its rows, the store it needs, its handler and its steps."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol
from uuid import UUID

import agentruns
from agentruns import (
    AgentRun,
    AgentRunHandler,
    AgentRunState,
    BudgetHold,
    RunChange,
    RunKind,
    RunKindPolicy,
    StepEvent,
    TerminationReason,
    Transaction,
)

MIGRATIONS = agentruns.MigrationChain(
    versions=Path(__file__).resolve().parent / "migrations",
    version_table="tickets_example_version",
)


class TicketStatus(enum.StrEnum):
    WAITING = "waiting"
    TRIAGING = "triaging"
    TRIAGED = "triaged"
    ABANDONED = "abandoned"


def status_of(run: AgentRun) -> TicketStatus:
    """The ticket's status as its run stands."""
    if run.state is AgentRunState.QUEUED:
        return TicketStatus.WAITING
    if run.state is AgentRunState.LEASED:
        return TicketStatus.TRIAGING
    if run.end_reason is TerminationReason.COMPLETED:
        return TicketStatus.TRIAGED
    return TicketStatus.ABANDONED


@dataclass(frozen=True, slots=True)
class Ticket:
    """The domain row: one per triage run. ``claims`` counts the run's claims so far."""

    run_id: UUID
    workspace: str
    ticket: str
    status: TicketStatus
    claims: int


@dataclass(frozen=True, slots=True)
class Quota:
    """How many more triages a workspace may complete before ``renews_at``.

    The quota is checked when runs are claimed and spent when one completes, so a claim of
    several runs at once may pass it by up to the claim's size: a soft limit, as a cost budget
    checked at claim time is."""

    workspace: str
    remaining: int
    renews_at: datetime


class TicketStore(Protocol):
    """The host's tables, read and written inside agentruns' transactions."""

    async def insert(self, tx: Transaction, ticket: Ticket) -> None: ...

    async def get(self, tx: Transaction, run_id: UUID) -> Ticket | None: ...

    async def lock(self, tx: Transaction, run_id: UUID) -> Ticket | None: ...

    async def move(
        self, tx: Transaction, run_id: UUID, status: TicketStatus, claims: int
    ) -> None: ...

    async def quota(self, tx: Transaction, workspace: str) -> Quota | None: ...

    async def set_quota(self, tx: Transaction, quota: Quota) -> None: ...

    async def spend(self, tx: Transaction, workspace: str) -> None:
        """One triage done: one less remaining (a workspace without a quota is unlimited)."""
        ...


class TriageHandler(AgentRunHandler):
    """Keeps each ticket's row agreeing with its run, and holds a workspace whose quota is
    spent until the quota renews (renewing it is the host's business: :meth:`TicketStore.
    set_quota`, then ``AgentRuns.release_budget``)."""

    def __init__(self, store: TicketStore) -> None:
        self._store = store

    async def lock_domain_row(self, tx: Transaction, run: AgentRun) -> None:
        await self._store.lock(tx, run.id)

    async def on_take_back(self, tx: Transaction, run: AgentRun, change: RunChange) -> None:
        await self.on_moved(tx, run.apply(change))

    async def on_moved(self, tx: Transaction, run: AgentRun) -> None:
        status = status_of(run)
        if await self._store.get(tx, run.id) is None:
            await self._store.insert(tx, Ticket(run.id, run.workspace, run.subject, status, 0))
            return
        await self._store.move(tx, run.id, status, run.epoch)
        if status is TicketStatus.TRIAGED:
            await self._store.spend(tx, run.workspace)

    async def check_budget(self, tx: Transaction, run: AgentRun) -> BudgetHold | None:
        quota = await self._store.quota(tx, run.workspace)
        if quota is None or quota.remaining > 0:
            return None
        return BudgetHold(run.workspace, quota.renews_at, "triage quota spent")


LABELS = {"refund": "billing", "invoice": "billing", "password": "access", "login": "access"}


async def triage(run: AgentRun) -> AsyncIterator[StepEvent]:
    """Read the ticket, then label it (a model call would go here)."""
    text = str(run.payload.get("text", ""))
    yield StepEvent("read", {"ticket": run.subject, "words": len(text.split())})
    label = next((label for word, label in LABELS.items() if word in text.lower()), "general")
    yield StepEvent("labelled", {"label": label})


def triage_kind(store: TicketStore) -> RunKind:
    policy = RunKindPolicy(name="triage", lease=timedelta(minutes=1), deadline=timedelta(days=1))
    return RunKind(policy, triage, TriageHandler(store))


def tickets_for(family: object) -> TicketStore:
    """The ticket tables of an adapter family: beside the memory stores, or on PostgreSQL."""
    from agentruns.testing import MemoryFamily
    from examples.tickets.memory import MemoryTickets
    from examples.tickets.postgres import PostgresTickets

    if isinstance(family, MemoryFamily):
        return MemoryTickets(family.database)
    return PostgresTickets()
