"""Ticket triage: a host's run kind with a domain row and a budget, written entirely outside
agentruns, against its public surface only.

Each run triages one support ticket. The host keeps a ``support_ticket`` row per run (its
status follows the run: waiting, triaging, triaged or abandoned) and a triage quota per
workspace: a workspace whose quota is spent is held until the quota renews, and its tickets wait
(no attempt spent). Its pieces are the ones any host writes:

- :mod:`examples.tickets.desk`: the rows, the store port, the handler and the steps;
- :mod:`examples.tickets.memory` and :mod:`examples.tickets.postgres`: the store, for tests in
  memory and for PostgreSQL, on agentruns' own transactions;
- ``migrations/``: its tables, a chain of its own (:data:`MIGRATIONS`), applied after agentruns'
  schema with ``agentruns.migrate(url, chain=MIGRATIONS)``;
- :data:`KINDS`: what ``agentruns worker --kinds examples.tickets:KINDS`` runs.

``tests/examples/test_tickets.py`` runs it on both adapters with the test kit.
"""

from examples.tickets.desk import (
    MIGRATIONS,
    Quota,
    Ticket,
    TicketStatus,
    TicketStore,
    TriageHandler,
    tickets_for,
    triage_kind,
)
from examples.tickets.postgres import PostgresTickets

KINDS = [triage_kind(PostgresTickets())]
"""The triage kind on PostgreSQL, for ``agentruns worker --kinds examples.tickets:KINDS``."""

__all__ = [
    "KINDS",
    "MIGRATIONS",
    "PostgresTickets",
    "Quota",
    "Ticket",
    "TicketStatus",
    "TicketStore",
    "TriageHandler",
    "tickets_for",
    "triage_kind",
]
