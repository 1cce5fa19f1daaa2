"""A review job agrees with its run in workspace, subject and attempt too, not only in state.

Revision ID: r0002_review_job_agrees
Revises: r0001_review_job

The deferred check ``review_job_run_agrees`` compared a job's status with its run's state only,
so raw SQL could commit a job naming another workspace or subject than its run, or an attempt
other than ``review_attempt(run)`` (the run's epoch less one while leased, else its epoch). It
now refuses those too (ADRs/0016), with the same one joined read at commit.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

revision = "r0002_review_job_agrees"
down_revision = "r0001_review_job"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE OR REPLACE FUNCTION review_job_run_agrees() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    pair record;
    target uuid;
    run_attempt integer;
BEGIN
    IF TG_TABLE_NAME = 'review_job' THEN
        target := NEW.run_id;
    ELSE
        target := NEW.id;
    END IF;
    SELECT j.status, j.workspace AS job_workspace, j.subject AS job_subject,
           j.attempt AS job_attempt, r.state, r.workspace, r.subject, r.epoch INTO pair
        FROM review_job j JOIN agent_run r ON r.id = j.run_id WHERE j.run_id = target;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF NOT ((pair.status = 'queued' AND pair.state = 'queued')
            OR (pair.status = 'running' AND pair.state = 'leased')
            OR (pair.status = 'ended' AND pair.state = 'ended')) THEN
        RAISE EXCEPTION 'review job % is % but its run is %', target, pair.status, pair.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'review_job_run_agrees';
    END IF;
    run_attempt := pair.epoch - CASE WHEN pair.state = 'leased' THEN 1 ELSE 0 END;
    IF pair.job_workspace IS DISTINCT FROM pair.workspace
            OR pair.job_subject IS DISTINCT FROM pair.subject
            OR pair.job_attempt IS DISTINCT FROM run_attempt THEN
        RAISE EXCEPTION 'review job % names %/% at attempt % but its run is %/% at attempt %',
            target, pair.job_workspace, pair.job_subject, pair.job_attempt, pair.workspace,
            pair.subject, run_attempt
            USING ERRCODE = 'check_violation', CONSTRAINT = 'review_job_run_agrees';
    END IF;
    RETURN NULL;
END
$$;
"""


def _first_function() -> str:
    """r0001's check, which a downgrade restores (its table and triggers stay)."""
    path = Path(__file__).with_name("r0001_review_job.py")
    spec = importlib.util.spec_from_file_location("review_migration_r0001", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function = str(module.UPGRADE).split("CREATE OR REPLACE FUNCTION", 1)[1]
    return "CREATE OR REPLACE FUNCTION" + function.split("DROP TRIGGER", 1)[0]


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(_first_function())
