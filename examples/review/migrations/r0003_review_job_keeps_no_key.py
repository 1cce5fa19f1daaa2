"""A review job keeps no foreign key to its run, which moves to agent_run_history once it ended.

Revision ID: r0003_review_job_keeps_no_key
Revises: r0002_review_job_agrees

Runs after agentruns' revision ``0030_run_history``. agentruns' reaper moves an ended run from
``agent_run`` to ``agent_run_history`` (its ADR 0035), and leaves every run where it is while any
table has a foreign key to ``agent_run``: the move's delete would take this table's rows with it
(``ON DELETE CASCADE``). The key goes; what it did stays: a run deleted for good (a purge, in
either table) takes its job with it (``review_job_run_gone``), and the deferred check reads the run
wherever it is (``agent_run_all``).

Downgrading restores the key (``NOT VALID``: the jobs of runs already moved keep their rows) and
r0002's check.
"""

from __future__ import annotations

from alembic import op

revision = "r0003_review_job_keeps_no_key"
down_revision = "r0002_review_job_agrees"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE review_job DROP CONSTRAINT review_job_run_id_fkey;

CREATE FUNCTION review_job_run_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A lateral lookup by key: an anti-join's plan, cached while the tables were small, can
    -- read more of them per run as they grow.
    DELETE FROM review_job j WHERE j.run_id = ANY (ARRAY(
        SELECT g.id FROM gone_runs g
        LEFT JOIN LATERAL (SELECT a.id FROM agent_run_all a WHERE a.id = g.id LIMIT 1) a ON true
        WHERE a.id IS NULL));
    RETURN NULL;
END
$$;

CREATE TRIGGER review_job_run_gone AFTER DELETE ON agent_run REFERENCING OLD TABLE AS gone_runs
    FOR EACH STATEMENT EXECUTE FUNCTION review_job_run_gone();
CREATE TRIGGER review_job_run_gone AFTER DELETE ON agent_run_history
    REFERENCING OLD TABLE AS gone_runs
    FOR EACH STATEMENT EXECUTE FUNCTION review_job_run_gone();

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
        FROM review_job j JOIN agent_run_all r ON r.id = j.run_id WHERE j.run_id = target;
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

DOWNGRADE = """
DROP TRIGGER review_job_run_gone ON agent_run_history;
DROP TRIGGER review_job_run_gone ON agent_run;
DROP FUNCTION review_job_run_gone();
ALTER TABLE review_job ADD CONSTRAINT review_job_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES agent_run (id) ON DELETE CASCADE NOT VALID;

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


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
