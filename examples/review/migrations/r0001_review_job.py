"""The review example's table and its deferred check.

Revision ID: r0001_review_job
Revises:

Runs after agentruns' schema (``agent_run`` must exist). A database migrated before the example
left the core schema may have the table already, with jobs in it: it is adopted as it stands.
"""

from __future__ import annotations

from alembic import op

revision = "r0001_review_job"
down_revision = None
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE IF NOT EXISTS review_job (
    run_id uuid PRIMARY KEY REFERENCES agent_run (id) ON DELETE CASCADE,
    workspace text NOT NULL,
    subject text NOT NULL,
    status text NOT NULL,
    attempt integer NOT NULL,
    CONSTRAINT ck_review_job_status CHECK (status IN ('queued', 'running', 'ended'))
);

CREATE OR REPLACE FUNCTION review_job_run_agrees() RETURNS trigger LANGUAGE plpgsql AS $$
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

DROP TRIGGER IF EXISTS review_job_run_agrees ON review_job;
DROP TRIGGER IF EXISTS review_job_run_agrees ON agent_run;
CREATE CONSTRAINT TRIGGER review_job_run_agrees AFTER INSERT OR UPDATE ON review_job
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION review_job_run_agrees();
CREATE CONSTRAINT TRIGGER review_job_run_agrees AFTER UPDATE ON agent_run
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION review_job_run_agrees();
"""

DOWNGRADE = """
DROP TRIGGER review_job_run_agrees ON agent_run;
DROP TABLE review_job;
DROP FUNCTION review_job_run_agrees();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
