"""Support tickets and triage quotas.

Revision ID: t0001_tickets
Revises:

The first revision of the tickets example's own chain (version table
``tickets_example_version``); it runs after agentruns' schema, since a ticket references its run.
"""

from __future__ import annotations

from alembic import op

revision = "t0001_tickets"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
CREATE TABLE support_ticket (
    run_id uuid PRIMARY KEY REFERENCES agent_run (id) ON DELETE CASCADE,
    workspace text NOT NULL,
    ticket text NOT NULL,
    status text NOT NULL,
    claims integer NOT NULL,
    CONSTRAINT ck_support_ticket_status
        CHECK (status IN ('waiting', 'triaging', 'triaged', 'abandoned'))
);
CREATE TABLE ticket_quota (
    workspace text PRIMARY KEY,
    remaining integer NOT NULL CHECK (remaining >= 0),
    renews_at timestamptz NOT NULL
);
""")


def downgrade() -> None:
    op.execute("DROP TABLE ticket_quota; DROP TABLE support_ticket;")
