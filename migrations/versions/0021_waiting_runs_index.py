"""The console's waiting runs by an index of their own (issue 24, part 5).

Revision ID: 0021_waiting_runs_index
Revises: 0020_run_results

``ix_agent_run_waits``: the waiting runs (queued, with a wait's end) in the order their waits
end, with what the overview shows of them. Partial, so only a wait's give-back writes it (a
claim, renewal or end makes a row version outside it); the overview's waiting counts per
workspace and its soonest-ending waits read it alone instead of every queued run.
"""

from __future__ import annotations

from alembic import op

revision = "0021_waiting_runs_index"
down_revision = "0020_run_results"
branch_labels = None
depends_on = None

INDEX = """
CREATE INDEX ix_agent_run_waits ON agent_run (waiting_until, seq)
    INCLUDE (workspace, kind, subject, waiting_for)
    WHERE state = 'queued' AND waiting_until IS NOT NULL;
"""


def upgrade() -> None:
    op.execute(INDEX)


def downgrade() -> None:
    op.execute("DROP INDEX ix_agent_run_waits;")
