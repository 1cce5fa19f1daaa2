"""Runs, their events, workspaces, budget holds, review jobs, and the claim's bookkeeping.

Revision ID: 0001_runs
Revises:

The triggers keep the database honest whoever writes: ``guard_agent_run`` refuses moves outside
the state table and changes of a run's identity; ``agent_run_bookkeeping`` keeps one row per
subject naming its offered head (the claim reads those rows, never the runs table) and sends the
wake-up NOTIFY; ``review_job_run_agrees`` refuses a commit where a review job and its run disagree.
ADRs/0004 explains the claim's indexes.
"""

from __future__ import annotations

from alembic import op

revision = "0001_runs"
down_revision = None
branch_labels = None
depends_on = None

TABLES = """
CREATE TABLE agent_workspace (
    id text PRIMARY KEY,
    active boolean NOT NULL DEFAULT true
);

CREATE TABLE agent_budget_hold (
    workspace text PRIMARY KEY,
    until timestamptz NOT NULL,
    reason text NOT NULL DEFAULT ''
);

CREATE SEQUENCE agent_run_seq AS bigint;

CREATE TABLE agent_run (
    id uuid PRIMARY KEY,
    kind text NOT NULL,
    workspace text NOT NULL,
    subject text NOT NULL,
    band smallint NOT NULL,
    payload jsonb NOT NULL,
    state text NOT NULL,
    epoch integer NOT NULL,
    attempt integer NOT NULL,
    seq bigint NOT NULL DEFAULT nextval('agent_run_seq'),
    enqueued_at timestamptz NOT NULL,
    due_at timestamptz NOT NULL,
    lease interval NOT NULL,
    deadline_at timestamptz,
    leased_until timestamptz,
    holder text,
    end_reason text,
    ended_at timestamptz,
    continues uuid,
    CONSTRAINT ck_agent_run_state CHECK (state IN ('queued', 'leased', 'ended')),
    CONSTRAINT ck_agent_run_band CHECK (band BETWEEN 0 AND 2),
    CONSTRAINT ck_agent_run_counts CHECK (epoch >= 0 AND attempt >= 0),
    CONSTRAINT ck_agent_run_lease CHECK (state <> 'leased' OR leased_until IS NOT NULL),
    CONSTRAINT ck_agent_run_end CHECK ((state = 'ended') = (end_reason IS NOT NULL))
);
ALTER SEQUENCE agent_run_seq OWNED BY agent_run.seq;

CREATE UNIQUE INDEX uq_agent_run_leased_subject ON agent_run (subject) WHERE state = 'leased';
CREATE INDEX ix_agent_run_queued_subject ON agent_run (subject, seq) WHERE state = 'queued';
CREATE INDEX ix_agent_run_leased_workspace ON agent_run (workspace) WHERE state = 'leased';
CREATE INDEX ix_agent_run_lease_expiry ON agent_run (leased_until) WHERE state = 'leased';
CREATE INDEX ix_agent_run_queued_deadline ON agent_run (deadline_at)
    WHERE state = 'queued' AND deadline_at IS NOT NULL;
CREATE INDEX ix_agent_run_ended_at ON agent_run (ended_at) WHERE state = 'ended';

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

CREATE TABLE agent_run_event (
    run_id uuid NOT NULL REFERENCES agent_run (id) ON DELETE CASCADE,
    seq integer NOT NULL,
    epoch integer NOT NULL,
    type text NOT NULL,
    data jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    CONSTRAINT uq_agent_run_event_seq UNIQUE (run_id, seq)
);

CREATE TABLE review_job (
    run_id uuid PRIMARY KEY REFERENCES agent_run (id) ON DELETE CASCADE,
    workspace text NOT NULL,
    subject text NOT NULL,
    status text NOT NULL,
    attempt integer NOT NULL,
    CONSTRAINT ck_review_job_status CHECK (status IN ('queued', 'running', 'ended'))
);
"""

GUARD = """
CREATE FUNCTION guard_agent_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'queued' THEN
            RAISE EXCEPTION 'agent_run %: a run is inserted queued, not %', NEW.id, NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.kind IS DISTINCT FROM OLD.kind
            OR NEW.workspace IS DISTINCT FROM OLD.workspace
            OR NEW.subject IS DISTINCT FROM OLD.subject THEN
        RAISE EXCEPTION 'agent_run %: a run never changes its identity', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run';
    END IF;
    IF NOT ((OLD.state = 'queued' AND NEW.state IN ('leased', 'ended'))
            OR (OLD.state = 'leased' AND NEW.state IN ('leased', 'queued', 'ended'))) THEN
        RAISE EXCEPTION 'agent_run %: illegal transition % -> %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run';
    END IF;
    IF NEW.epoch < OLD.epoch THEN
        RAISE EXCEPTION 'agent_run %: the epoch never goes back (% -> %)',
            OLD.id, OLD.epoch, NEW.epoch
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER guard_agent_run BEFORE INSERT OR UPDATE ON agent_run
    FOR EACH ROW EXECUTE FUNCTION guard_agent_run();
"""

# Every writer of a subject's runs locks the subject's row first (here, in the trigger), so the
# head computed after the lock sees every other writer of the subject committed: under READ
# COMMITTED each statement of this volatile function takes a fresh snapshot.
BOOKKEEPING = """
CREATE FUNCTION agent_run_bookkeeping() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER agent_run_bookkeeping AFTER INSERT OR UPDATE OR DELETE ON agent_run
    FOR EACH ROW EXECUTE FUNCTION agent_run_bookkeeping();
"""

REVIEWS = """
CREATE FUNCTION review_job_run_agrees() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    job_status text;
    run_state text;
    target uuid;
BEGIN
    IF TG_TABLE_NAME = 'review_job' THEN
        target := NEW.run_id;
    ELSE
        target := NEW.id;
    END IF;
    SELECT j.status, r.state INTO job_status, run_state
        FROM review_job j JOIN agent_run r ON r.id = j.run_id WHERE j.run_id = target;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF NOT ((job_status = 'queued' AND run_state = 'queued')
            OR (job_status = 'running' AND run_state = 'leased')
            OR (job_status = 'ended' AND run_state = 'ended')) THEN
        RAISE EXCEPTION 'review job % is % but its run is %', target, job_status, run_state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'review_job_run_agrees';
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER review_job_run_agrees AFTER INSERT OR UPDATE ON review_job
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION review_job_run_agrees();
CREATE CONSTRAINT TRIGGER review_job_run_agrees AFTER UPDATE ON agent_run
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION review_job_run_agrees();
"""

DROP = """
DROP TABLE review_job;
DROP TABLE agent_run_event;
DROP TABLE agent_subject;
DROP TABLE agent_run;
DROP TABLE agent_budget_hold;
DROP TABLE agent_workspace;
DROP FUNCTION review_job_run_agrees();
DROP FUNCTION agent_run_bookkeeping();
DROP FUNCTION guard_agent_run();
"""


def upgrade() -> None:
    for block in (TABLES, GUARD, BOOKKEEPING, REVIEWS):
        op.execute(block)


def downgrade() -> None:
    op.execute(DROP)
