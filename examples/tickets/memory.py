"""The ticket tables in memory, in the memory family's transactions (for a host's tests)."""

from __future__ import annotations

from dataclasses import replace
from uuid import UUID

from agentruns import IllegalTransition, Transaction
from agentruns.testing import MemoryDatabase, MemoryTable
from examples.tickets.desk import Quota, Ticket, TicketStatus, TicketStore


class MemoryTickets(TicketStore):
    def __init__(self, database: MemoryDatabase) -> None:
        self._database = database
        self.tickets: MemoryTable[UUID, Ticket] = MemoryTable(database)
        self.quotas: MemoryTable[str, Quota] = MemoryTable(database)

    async def insert(self, tx: Transaction, ticket: Ticket) -> None:
        if self.tickets.get(ticket.run_id) is not None:  # as PostgreSQL's primary key refuses
            raise IllegalTransition("the database", "refused", f"{ticket.run_id} has a ticket")
        self.tickets.put(tx, ticket.run_id, ticket)

    async def get(self, tx: Transaction, run_id: UUID) -> Ticket | None:
        self._database.check(tx)
        return self.tickets.get(run_id)

    async def lock(self, tx: Transaction, run_id: UUID) -> Ticket | None:
        return await self.get(tx, run_id)  # memory transactions run one at a time

    async def move(self, tx: Transaction, run_id: UUID, status: TicketStatus, claims: int) -> None:
        ticket = self.tickets.get(run_id)
        if ticket is not None:
            self.tickets.put(tx, run_id, replace(ticket, status=status, claims=claims))

    async def quota(self, tx: Transaction, workspace: str) -> Quota | None:
        self._database.check(tx)
        return self.quotas.get(workspace)

    async def set_quota(self, tx: Transaction, quota: Quota) -> None:
        self.quotas.put(tx, quota.workspace, quota)

    async def spend(self, tx: Transaction, workspace: str) -> None:
        quota = self.quotas.get(workspace)
        if quota is not None:
            self.quotas.put(tx, workspace, replace(quota, remaining=max(quota.remaining - 1, 0)))
