"""Failure records, the last failure on the run, the enqueuer's trace, the domain-row flag.

Revision ID: 0006_failure_records
Revises: 0007_schedules

``agent_run_failure`` keeps one row per failed attempt (error type, message, failure class,
attempt, epoch, holder, a bounded and redacted traceback) for the run's life: it goes with its
run (``ON DELETE CASCADE``, so ``purge`` takes it too). The run carries its newest failure in
``last_error_type``/``last_error``/``last_failure_class``, written in the same statement as the
record while the run is still leased (ADRs/0014), so a list of runs needs no join. The run also
keeps the trace context of its enqueuer (``trace_context``: the W3C carrier, or NULL) and
whether its kind kept a domain row when it was enqueued (``domain_row``). Every column is
nullable or has a constant default: adding them rewrites no row. ``ix_agent_run_continues``
(partial: only continuations have entries) lets ``runs retry`` find a run's continuation.
"""

from __future__ import annotations

from alembic import op

revision = "0006_failure_records"
down_revision = "0007_schedules"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE agent_run
    ADD COLUMN domain_row boolean NOT NULL DEFAULT false,
    ADD COLUMN trace_context jsonb,
    ADD COLUMN last_error_type text,
    ADD COLUMN last_error text,
    ADD COLUMN last_failure_class text;

CREATE TABLE agent_run_failure (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id uuid NOT NULL REFERENCES agent_run (id) ON DELETE CASCADE,
    epoch integer NOT NULL,
    attempt integer NOT NULL,
    holder text,
    error_type text NOT NULL,
    message text NOT NULL,
    failure_class text NOT NULL,
    traceback text NOT NULL,
    recorded_at timestamptz NOT NULL
);
CREATE INDEX ix_agent_run_failure_run ON agent_run_failure (run_id, id);
CREATE INDEX ix_agent_run_continues ON agent_run (continues) WHERE continues IS NOT NULL;
"""

DOWNGRADE = """
DROP INDEX ix_agent_run_continues;
DROP TABLE agent_run_failure;
ALTER TABLE agent_run
    DROP COLUMN last_failure_class,
    DROP COLUMN last_error,
    DROP COLUMN last_error_type,
    DROP COLUMN trace_context,
    DROP COLUMN domain_row;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
