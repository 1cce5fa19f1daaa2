"""Sandboxes: one row per agent-sandbox claim, guarded by ``guard_agent_sandbox``.

Revision ID: 0002_sandboxes
Revises: 0001_runs

A sandbox's row is the single owner of its claim. ``guard_agent_sandbox`` refuses a row that is
not inserted REQUESTED, every move outside REQUESTED -> READY | DELETING, READY -> DELETING (a
READY row may be touched, a DELETING row never changes), and every change of its identity.
``uq_agent_sandbox_live_subject`` keeps at most one live (REQUESTED or READY) sandbox per subject.
"""

from __future__ import annotations

from alembic import op

revision = "0002_sandboxes"
down_revision = "0001_runs"
branch_labels = None
depends_on = None

TABLE = """
CREATE TABLE agent_sandbox (
    id uuid PRIMARY KEY,
    kind text NOT NULL,
    workspace text NOT NULL,
    subject text NOT NULL,
    state text NOT NULL,
    requested_at timestamptz NOT NULL,
    ready_at timestamptz,
    last_used_at timestamptz,
    shutdown_at timestamptz NOT NULL,
    claim_name text NOT NULL,
    conversation boolean NOT NULL DEFAULT false,
    CONSTRAINT ck_agent_sandbox_state CHECK (state IN ('requested', 'ready', 'deleting')),
    CONSTRAINT ck_agent_sandbox_ready CHECK (state <> 'ready' OR ready_at IS NOT NULL),
    CONSTRAINT uq_agent_sandbox_claim_name UNIQUE (claim_name)
);

CREATE UNIQUE INDEX uq_agent_sandbox_live_subject ON agent_sandbox (subject)
    WHERE state IN ('requested', 'ready');
CREATE INDEX ix_agent_sandbox_deleting ON agent_sandbox (requested_at)
    WHERE state = 'deleting';
"""

GUARD = """
CREATE FUNCTION guard_agent_sandbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'requested' THEN
            RAISE EXCEPTION 'agent_sandbox %: a sandbox is inserted requested, not %',
                NEW.id, NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.kind IS DISTINCT FROM OLD.kind
            OR NEW.workspace IS DISTINCT FROM OLD.workspace
            OR NEW.subject IS DISTINCT FROM OLD.subject
            OR NEW.claim_name IS DISTINCT FROM OLD.claim_name
            OR NEW.conversation IS DISTINCT FROM OLD.conversation
            OR NEW.requested_at IS DISTINCT FROM OLD.requested_at
            OR NEW.shutdown_at IS DISTINCT FROM OLD.shutdown_at THEN
        RAISE EXCEPTION 'agent_sandbox %: a sandbox never changes its identity', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
    END IF;
    IF NOT ((OLD.state = 'requested' AND NEW.state IN ('requested', 'ready', 'deleting'))
            OR (OLD.state = 'ready' AND NEW.state IN ('ready', 'deleting'))) THEN
        RAISE EXCEPTION 'agent_sandbox %: illegal transition % -> %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER guard_agent_sandbox BEFORE INSERT OR UPDATE ON agent_sandbox
    FOR EACH ROW EXECUTE FUNCTION guard_agent_sandbox();
"""

DROP = """
DROP TABLE agent_sandbox;
DROP FUNCTION guard_agent_sandbox();
"""


def upgrade() -> None:
    for block in (TABLE, GUARD):
        op.execute(block)


def downgrade() -> None:
    op.execute(DROP)
