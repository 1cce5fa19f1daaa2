"""Subjects are named within their workspace: (workspace, subject) is a subject's identity.

Revision ID: 0003_workspace_subjects
Revises: 0002_sandboxes

Before this revision a subject string was global: two workspaces that used the same subject
shared one head row, one lease and one live sandbox, so one workspace's sandbox could lease the
other's runs and each blocked the other's leases. Every key over subjects now leads with the
workspace: the one-lease index, the queued-runs index, ``agent_subject`` (rebuilt from the runs,
its heads recomputed per workspace and subject) and the one-live-sandbox index. The bookkeeping
trigger locks and recomputes the (workspace, subject) row.

Downgrading restores global subjects; it fails on the unique indexes if two workspaces hold a
leased run or a live sandbox on the same subject string at that moment.
"""

from __future__ import annotations

from alembic import op

revision = "0003_workspace_subjects"
down_revision = "0002_sandboxes"
branch_labels = None
depends_on = None

RUN_INDEXES = """
DROP INDEX uq_agent_run_leased_subject;
CREATE UNIQUE INDEX uq_agent_run_leased_subject ON agent_run (workspace, subject)
    WHERE state = 'leased';
DROP INDEX ix_agent_run_queued_subject;
CREATE INDEX ix_agent_run_queued_subject ON agent_run (workspace, subject, seq)
    WHERE state = 'queued';
"""

SUBJECTS = """
DROP TABLE agent_subject;
CREATE TABLE agent_subject (
    workspace text NOT NULL,
    subject text NOT NULL,
    head_run uuid,
    head_kind text,
    head_band smallint,
    head_due_at timestamptz,
    head_seq bigint,
    PRIMARY KEY (workspace, subject)
);
CREATE INDEX ix_agent_subject_offered ON agent_subject
    (workspace, head_band, head_due_at, head_seq) WHERE head_run IS NOT NULL;

INSERT INTO agent_subject (workspace, subject)
    SELECT DISTINCT workspace, subject FROM agent_run WHERE state <> 'ended';
UPDATE agent_subject s SET head_run = h.id, head_kind = h.kind, head_band = h.band,
        head_due_at = h.due_at, head_seq = h.seq
    FROM (SELECT DISTINCT ON (r.workspace, r.subject) r.workspace, r.subject, r.id, r.kind,
                 r.band, r.due_at, r.seq
          FROM agent_run r
          WHERE r.state = 'queued' AND NOT EXISTS (
              SELECT 1 FROM agent_run l
              WHERE l.workspace = r.workspace AND l.subject = r.subject AND l.state = 'leased')
          ORDER BY r.workspace, r.subject, r.seq) h
    WHERE s.workspace = h.workspace AND s.subject = h.subject;
"""

# As 0001's trigger, with every subject lookup keyed by (workspace, subject).
BOOKKEEPING = """
CREATE OR REPLACE FUNCTION agent_run_bookkeeping() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    run agent_run%ROWTYPE;
    head record;
    head_id uuid := NULL;
BEGIN
    IF TG_OP = 'DELETE' THEN
        run := OLD;
        IF OLD.state = 'ended' THEN
            RETURN NULL;
        END IF;
    ELSE
        run := NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.state = NEW.state AND NEW.state <> 'queued' THEN
        RETURN NULL;  -- a renewal moves no head
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO agent_workspace (id) VALUES (NEW.workspace) ON CONFLICT DO NOTHING;
    END IF;
    PERFORM 1 FROM agent_subject
        WHERE workspace = run.workspace AND subject = run.subject FOR UPDATE;
    IF NOT FOUND THEN  -- the subject's first run
        INSERT INTO agent_subject (workspace, subject) VALUES (run.workspace, run.subject)
            ON CONFLICT DO NOTHING;
        PERFORM 1 FROM agent_subject
            WHERE workspace = run.workspace AND subject = run.subject FOR UPDATE;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.state = 'leased' THEN
        -- A claim: the subject now has a leased run, so it offers no head; nothing to look up.
        UPDATE agent_subject SET head_run = NULL, head_kind = NULL, head_band = NULL,
                head_due_at = NULL, head_seq = NULL
            WHERE workspace = run.workspace AND subject = run.subject AND head_run IS NOT NULL;
        RETURN NULL;
    END IF;
    IF NOT EXISTS (
            SELECT 1 FROM agent_run r
            WHERE r.workspace = run.workspace AND r.subject = run.subject
              AND r.state = 'leased') THEN
        SELECT r.id, r.kind, r.band, r.due_at, r.seq INTO head
            FROM agent_run r
            WHERE r.workspace = run.workspace AND r.subject = run.subject AND r.state = 'queued'
            ORDER BY r.seq LIMIT 1;
        IF FOUND THEN
            head_id := head.id;
        END IF;
    END IF;
    IF head_id IS NULL THEN
        UPDATE agent_subject SET head_run = NULL, head_kind = NULL, head_band = NULL,
                head_due_at = NULL, head_seq = NULL
            WHERE workspace = run.workspace AND subject = run.subject AND head_run IS NOT NULL;
    ELSE
        UPDATE agent_subject SET head_run = head.id, head_kind = head.kind,
                head_band = head.band, head_due_at = head.due_at, head_seq = head.seq
            WHERE workspace = run.workspace AND subject = run.subject
                AND (head_run IS DISTINCT FROM head.id OR head_due_at IS DISTINCT FROM head.due_at
                    OR head_band IS DISTINCT FROM head.band);
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.state = 'queued'
            AND (TG_OP = 'INSERT' OR OLD.state <> 'queued') THEN
        PERFORM pg_notify('agent_run', NEW.workspace);
    END IF;
    RETURN NULL;
END
$$;
"""

SANDBOXES = """
DROP INDEX uq_agent_sandbox_live_subject;
CREATE UNIQUE INDEX uq_agent_sandbox_live_subject ON agent_sandbox (workspace, subject)
    WHERE state IN ('requested', 'ready');
"""

DOWN = """
DROP INDEX uq_agent_sandbox_live_subject;
CREATE UNIQUE INDEX uq_agent_sandbox_live_subject ON agent_sandbox (subject)
    WHERE state IN ('requested', 'ready');

DROP INDEX uq_agent_run_leased_subject;
CREATE UNIQUE INDEX uq_agent_run_leased_subject ON agent_run (subject) WHERE state = 'leased';
DROP INDEX ix_agent_run_queued_subject;
CREATE INDEX ix_agent_run_queued_subject ON agent_run (subject, seq) WHERE state = 'queued';

DROP TABLE agent_subject;
CREATE TABLE agent_subject (
    subject text PRIMARY KEY,
    head_run uuid,
    head_workspace text,
    head_kind text,
    head_band smallint,
    head_due_at timestamptz,
    head_seq bigint
);
CREATE INDEX ix_agent_subject_offered ON agent_subject
    (head_workspace, head_band, head_due_at, head_seq) WHERE head_run IS NOT NULL;
INSERT INTO agent_subject (subject)
    SELECT DISTINCT subject FROM agent_run WHERE state <> 'ended';
UPDATE agent_subject s SET head_run = h.id, head_workspace = h.workspace, head_kind = h.kind,
        head_band = h.band, head_due_at = h.due_at, head_seq = h.seq
    FROM (SELECT DISTINCT ON (r.subject) r.subject, r.id, r.workspace, r.kind, r.band,
                 r.due_at, r.seq
          FROM agent_run r
          WHERE r.state = 'queued' AND NOT EXISTS (
              SELECT 1 FROM agent_run l WHERE l.subject = r.subject AND l.state = 'leased')
          ORDER BY r.subject, r.seq) h
    WHERE s.subject = h.subject;
"""


# 0001's bookkeeping function, whose subjects are global: its trigger is still there.
GLOBAL_BOOKKEEPING = """
CREATE OR REPLACE FUNCTION agent_run_bookkeeping() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    run agent_run%ROWTYPE;
    head record;
    head_id uuid := NULL;
BEGIN
    IF TG_OP = 'DELETE' THEN
        run := OLD;
        IF OLD.state = 'ended' THEN
            RETURN NULL;
        END IF;
    ELSE
        run := NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.state = NEW.state AND NEW.state <> 'queued' THEN
        RETURN NULL;  -- a renewal moves no head
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO agent_workspace (id) VALUES (NEW.workspace) ON CONFLICT DO NOTHING;
    END IF;
    PERFORM 1 FROM agent_subject WHERE subject = run.subject FOR UPDATE;
    IF NOT FOUND THEN  -- the subject's first run
        INSERT INTO agent_subject (subject) VALUES (run.subject) ON CONFLICT DO NOTHING;
        PERFORM 1 FROM agent_subject WHERE subject = run.subject FOR UPDATE;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.state = 'leased' THEN
        -- A claim: the subject now has a leased run, so it offers no head; nothing to look up.
        UPDATE agent_subject SET head_run = NULL, head_workspace = NULL, head_kind = NULL,
                head_band = NULL, head_due_at = NULL, head_seq = NULL
            WHERE subject = run.subject AND head_run IS NOT NULL;
        RETURN NULL;
    END IF;
    IF NOT EXISTS (
            SELECT 1 FROM agent_run r WHERE r.subject = run.subject AND r.state = 'leased') THEN
        SELECT r.id, r.workspace, r.kind, r.band, r.due_at, r.seq INTO head
            FROM agent_run r WHERE r.subject = run.subject AND r.state = 'queued'
            ORDER BY r.seq LIMIT 1;
        IF FOUND THEN
            head_id := head.id;
        END IF;
    END IF;
    IF head_id IS NULL THEN
        UPDATE agent_subject SET head_run = NULL, head_workspace = NULL, head_kind = NULL,
                head_band = NULL, head_due_at = NULL, head_seq = NULL
            WHERE subject = run.subject AND head_run IS NOT NULL;
    ELSE
        UPDATE agent_subject SET head_run = head.id, head_workspace = head.workspace,
                head_kind = head.kind, head_band = head.band, head_due_at = head.due_at,
                head_seq = head.seq
            WHERE subject = run.subject
                AND (head_run IS DISTINCT FROM head.id OR head_due_at IS DISTINCT FROM head.due_at
                    OR head_band IS DISTINCT FROM head.band);
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.state = 'queued'
            AND (TG_OP = 'INSERT' OR OLD.state <> 'queued') THEN
        PERFORM pg_notify('agent_run', NEW.workspace);
    END IF;
    RETURN NULL;
END
$$;

"""


def upgrade() -> None:
    for block in (RUN_INDEXES, SUBJECTS, BOOKKEEPING, SANDBOXES):
        op.execute(block)


def downgrade() -> None:
    op.execute(DOWN)
    op.execute(GLOBAL_BOOKKEEPING)
