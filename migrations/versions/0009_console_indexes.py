"""The console's indexes: runs of each state in queue order, by workspace and subject, the few
that did not complete, and failed attempts by time.

Revision ID: 0009_console_indexes
Revises: 0005_claim_lanes

Each index on ``agent_run`` is partial on one state, so it is written only when a row version
enters that state (an enqueue or a requeue for the queued ones, an end for the ended ones) and
never by a claim or a renewal (ADRs/0018). The console's list merges one branch per state, each
read in queue order from these; its overview counts queued runs by an index-only scan of
``ix_agent_run_queued_console``. ``IF NOT EXISTS``: on a large table an operator may build them
first with ``CREATE INDEX CONCURRENTLY`` (the statements below), and this revision then takes
no lock for long.
"""

from __future__ import annotations

from alembic import op

revision = "0009_console_indexes"
down_revision = "0005_claim_lanes"
branch_labels = None
depends_on = None

INDEXES = {
    "ix_agent_run_queued_seq": "agent_run (seq) WHERE state = 'queued'",
    "ix_agent_run_queued_console": (
        "agent_run (workspace, subject, seq) INCLUDE (band, kind, due_at) WHERE state = 'queued'"
    ),
    "ix_agent_run_ended_seq": "agent_run (seq) WHERE state = 'ended'",
    "ix_agent_run_ended_workspace": "agent_run (workspace, seq) WHERE state = 'ended'",
    "ix_agent_run_ended_subject": "agent_run (workspace, subject, seq) WHERE state = 'ended'",
    "ix_agent_run_ended_unsuccessful": (
        "agent_run (end_reason, seq) WHERE state = 'ended' AND end_reason <> 'completed'"
    ),
    "ix_agent_run_failure_recorded": "agent_run_failure (recorded_at)",
}


def upgrade() -> None:
    for name, definition in INDEXES.items():
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {definition}")


def downgrade() -> None:
    for name in reversed(INDEXES):
        op.execute(f"DROP INDEX IF EXISTS {name}")
