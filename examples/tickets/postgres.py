"""The ticket tables on PostgreSQL, written on agentruns' transaction (``postgres_connection``),
so a ticket and its run commit or roll back together."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import RowMapping, text

from agentruns import Transaction, postgres_connection
from examples.tickets.desk import Quota, Ticket, TicketStatus, TicketStore

_TICKET = "run_id, workspace, ticket, status, claims"
INSERT = text(
    f"INSERT INTO support_ticket ({_TICKET}) "
    "VALUES (:run_id, :workspace, :ticket, :status, :claims)"
)
GET = text(f"SELECT {_TICKET} FROM support_ticket WHERE run_id = :run_id")
LOCK = text(f"SELECT {_TICKET} FROM support_ticket WHERE run_id = :run_id FOR UPDATE")
MOVE = text("UPDATE support_ticket SET status = :status, claims = :claims WHERE run_id = :run_id")
QUOTA = text("SELECT workspace, remaining, renews_at FROM ticket_quota WHERE workspace = :ws")
SET_QUOTA = text(
    "INSERT INTO ticket_quota (workspace, remaining, renews_at) VALUES (:ws, :remaining, :at) "
    "ON CONFLICT (workspace) DO UPDATE "
    "SET remaining = EXCLUDED.remaining, renews_at = EXCLUDED.renews_at"
)
SPEND = text("UPDATE ticket_quota SET remaining = greatest(remaining - 1, 0) WHERE workspace = :ws")


def _ticket(row: RowMapping) -> Ticket:
    return Ticket(
        run_id=row["run_id"],
        workspace=row["workspace"],
        ticket=row["ticket"],
        status=TicketStatus(row["status"]),
        claims=row["claims"],
    )


class PostgresTickets(TicketStore):
    async def insert(self, tx: Transaction, ticket: Ticket) -> None:
        await postgres_connection(tx).execute(
            INSERT,
            {
                "run_id": ticket.run_id,
                "workspace": ticket.workspace,
                "ticket": ticket.ticket,
                "status": ticket.status.value,
                "claims": ticket.claims,
            },
        )

    async def get(self, tx: Transaction, run_id: UUID) -> Ticket | None:
        row = (await postgres_connection(tx).execute(GET, {"run_id": run_id})).mappings().first()
        return None if row is None else _ticket(row)

    async def lock(self, tx: Transaction, run_id: UUID) -> Ticket | None:
        row = (await postgres_connection(tx).execute(LOCK, {"run_id": run_id})).mappings().first()
        return None if row is None else _ticket(row)

    async def move(self, tx: Transaction, run_id: UUID, status: TicketStatus, claims: int) -> None:
        await postgres_connection(tx).execute(
            MOVE, {"run_id": run_id, "status": status.value, "claims": claims}
        )

    async def quota(self, tx: Transaction, workspace: str) -> Quota | None:
        found = await postgres_connection(tx).execute(QUOTA, {"ws": workspace})
        row = found.mappings().first()
        return None if row is None else Quota(row["workspace"], row["remaining"], row["renews_at"])

    async def set_quota(self, tx: Transaction, quota: Quota) -> None:
        await postgres_connection(tx).execute(
            SET_QUOTA, {"ws": quota.workspace, "remaining": quota.remaining, "at": quota.renews_at}
        )

    async def spend(self, tx: Transaction, workspace: str) -> None:
        await postgres_connection(tx).execute(SPEND, {"ws": workspace})
