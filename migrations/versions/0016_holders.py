"""The holders: which processes lease runs, which kinds they claim, and when each was last seen.

Revision ID: 0016_holders
Revises: 0015_pinned_functions

``agent_holder`` has one row per process that leases runs: a worker, or a gateway for the
sandboxes it serves. The process writes it when it starts and about every ``renewal`` after, off
the claim path (a timer of its own, one row per process), on the database clock, and marks it
stopped when it shuts down cleanly. The domain reads the rows (``agentruns.domain.holders``): a
holder not seen for three renewals, or stopped, is gone; a lease whose holder is gone, or that was
not renewed within its holder's three renewals, is quiet; a queued kind no live holder claims has
nobody to run it. Rows not seen for a day are forgotten when a holder starts. The table is small
(one row per process) and read whole: its key is its only index.
"""

from __future__ import annotations

from alembic import op

revision = "0016_holders"
down_revision = "0015_pinned_functions"
branch_labels = None
depends_on = None

HOLDERS = """
CREATE TABLE agent_holder (
    holder text PRIMARY KEY,
    process text NOT NULL,
    kinds text[] NOT NULL DEFAULT '{}',
    renewal interval NOT NULL,
    started_at timestamptz NOT NULL,
    seen_at timestamptz NOT NULL,
    stopped_at timestamptz,
    CONSTRAINT ck_agent_holder_renewal CHECK (renewal > interval '0'),
    CONSTRAINT ck_agent_holder_seen CHECK (seen_at >= started_at)
);
"""


def upgrade() -> None:
    op.execute(HOLDERS)


def downgrade() -> None:
    op.execute("DROP TABLE agent_holder;")
