"""The event guard looks runs up by key whatever the statistics say.

Revision ID: 0013_event_guard_plan
Revises: 0012_guard_when

``guard_agent_run_event_insert`` (0004, 0005) joins a statement's new events to their runs. For a
group of a few hundred step boundaries the planner chose to read every run (a sequential scan
and a hash join): 40 µs of server time per event in the throughput bench, against 6-9 µs with
groups of 64. Like the claim (0005, 0011), the function now runs with sequential scans, hash
and merge joins off: one key lookup per new event, whatever the group's size (ADRs/0019).
"""

from __future__ import annotations

from alembic import op

revision = "0013_event_guard_plan"
down_revision = "0012_guard_when"
branch_labels = None
depends_on = None

_FUNCTION = "guard_agent_run_event_insert()"


def upgrade() -> None:
    op.execute(
        f"ALTER FUNCTION {_FUNCTION} SET enable_seqscan = off SET enable_hashjoin = off "
        "SET enable_mergejoin = off"
    )


def downgrade() -> None:
    op.execute(f"ALTER FUNCTION {_FUNCTION} RESET ALL")
