"""When a waiting run began to wait (issue 24, part 5).

Revision ID: 0022_waiting_since
Revises: 0021_waiting_runs_index

``agent_run.waiting_since``: written by a wait's give-back with its ``waiting_for`` and
``waiting_until`` (a resumed wait that parks again keeps the time it first began), cleared with
them by the wake-up or the resolved wait. The console and ``runs show`` say since when a run
waits; no statement of the worker loop names it.
"""

from __future__ import annotations

from alembic import op

revision = "0022_waiting_since"
down_revision = "0021_waiting_runs_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE agent_run ADD COLUMN waiting_since timestamp with time zone;")


def downgrade() -> None:
    op.execute("ALTER TABLE agent_run DROP COLUMN waiting_since;")
