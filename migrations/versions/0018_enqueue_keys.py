"""Enqueue keys: an enqueue with a key finds the run the key still names instead of making a second.

Revision ID: 0018_enqueue_keys
Revises: 0017_edge_guards

``agent_run_key`` holds each key a workspace used and the run it names now, one row per
(workspace, key), its primary key the only index. An enqueue with a key takes the key and inserts
the run in one statement (``INSERT ... ON CONFLICT DO NOTHING`` on the key, the run inserted only
if the key was taken): of two enqueues racing with one new key, the second waits for the first to
commit and finds its run. A key whose run ended longer ago than its kind's retention (or was
purged) is moved to the new run under the key row's lock (ADRs/0024).

``agent_run.enqueue_key`` is the key a run was enqueued with, for reading (``runs show``, the
console); it is written at enqueue only: ``guard_agent_run_frozen`` now names it, and its function
says so. Claims, renewals, step boundaries and ends name neither the column nor the table: the
worker loop reads and writes nothing more. A purge deletes the key rows of the runs it deletes
(those still naming them), in its own statement.
"""

from __future__ import annotations

from alembic import op

revision = "0018_enqueue_keys"
down_revision = "0017_edge_guards"
branch_labels = None
depends_on = None

KEYS = """
ALTER TABLE agent_run ADD COLUMN enqueue_key text;

CREATE TABLE agent_run_key (
    workspace text NOT NULL,
    key text NOT NULL,
    run_id uuid NOT NULL,
    PRIMARY KEY (workspace, key)
);
"""

FROZEN = """
CREATE OR REPLACE FUNCTION refuse_agent_run_frozen() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'agent_run %: a run keeps the payload, band, queue order, enqueue time, '
        'lease, deadline, continuation and enqueue key it was enqueued with (it is %)', OLD.id,
        OLD.state
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_frozen';
END
$$;

DROP TRIGGER guard_agent_run_frozen ON agent_run;

CREATE TRIGGER guard_agent_run_frozen
    BEFORE UPDATE OF payload, band, seq, enqueued_at, lease, deadline_at, continues, enqueue_key
    ON agent_run FOR EACH ROW EXECUTE FUNCTION refuse_agent_run_frozen();
"""

FROZEN_BEFORE = """
CREATE OR REPLACE FUNCTION refuse_agent_run_frozen() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'agent_run %: a run keeps the payload, band, queue order, enqueue time, '
        'lease, deadline and continuation it was enqueued with (it is %)', OLD.id, OLD.state
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_frozen';
END
$$;

DROP TRIGGER guard_agent_run_frozen ON agent_run;

CREATE TRIGGER guard_agent_run_frozen
    BEFORE UPDATE OF payload, band, seq, enqueued_at, lease, deadline_at, continues
    ON agent_run FOR EACH ROW EXECUTE FUNCTION refuse_agent_run_frozen();
"""


def upgrade() -> None:
    op.execute(KEYS)
    op.execute(FROZEN)


def downgrade() -> None:
    op.execute(FROZEN_BEFORE)
    op.execute("DROP TABLE agent_run_key;")
    op.execute("ALTER TABLE agent_run DROP COLUMN enqueue_key;")
