"""The review example leaves the core schema: ``review_job`` and its trigger are an opt-in chain.

Revision ID: 0008_review_example_out
Revises: 0003_workspace_subjects

Revision 0001 gave every database the worked example's ``review_job`` table and its deferred
check ``review_job_run_agrees``. They now belong to the review example
(``examples/review``), whose own chain of revisions (version table ``review_example_version``)
creates them where a host opts in (ADRs/0013). This revision drops them, unless the table holds
rows (a database that used the example keeps its jobs and their check, and the example's chain
adopts them) or the example's chain already owns them.
"""

from __future__ import annotations

from alembic import op

revision = "0008_review_example_out"
down_revision = "0003_workspace_subjects"
branch_labels = None
depends_on = None

UPGRADE = """
DO $$
BEGIN
    IF to_regclass('review_job') IS NOT NULL
            AND to_regclass('review_example_version') IS NULL
            AND NOT EXISTS (SELECT 1 FROM review_job) THEN
        DROP TRIGGER review_job_run_agrees ON agent_run;
        DROP TABLE review_job;
        DROP FUNCTION review_job_run_agrees();
    END IF;
END
$$;
"""

# Back to revision 0002: the table and its check as 0001 made them, where they are missing.
DOWNGRADE = """
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


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
