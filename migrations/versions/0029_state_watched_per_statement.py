"""A state change is announced once per statement, and the subject's lock is inlined.

Revision ID: 0029_state_watched_per_statement
Revises: 0028_rolling_budgets

Two costs the worker loop paid per run, measured by ``python -m bench.cpu_split`` under a
sampling profiler (ADRs/0034):

- ``agent_run_state_watched`` was a row trigger whose condition passes on every state change, so
  every claimed run and every ended run called it (two calls per run, 10.9 µs of server CPU per
  run) to find that nobody watches. It is now a statement trigger over the transition tables
  ``agent_run_moved`` already has PostgreSQL capture: one test that ``agent_run_watch`` is empty
  per updating statement, and only when somebody watches, the watched runs whose state changed.
- ``agent_subject_lock`` ran with ``SET search_path FROM CURRENT``, which keeps the planner from
  inlining it and saves and restores the setting on every call (one call per ended run and per
  enqueued run). It now names only ``pg_catalog``'s objects, qualified, so it needs no setting
  and is inlined into its callers; the lock it takes is the same.

Downgrading restores 0024_run_watch's row trigger and the lock function with its setting.
"""

from __future__ import annotations

from alembic import op

revision = "0029_state_watched_per_statement"
down_revision = "0028_rolling_budgets"
branch_labels = None
depends_on = None

STATE_WATCHED = """
DROP TRIGGER agent_run_state_watched ON agent_run;

-- A claim, a give-back, a requeue, a take-back or an end, once per updating statement: nobody
-- watching costs one test that agent_run_watch is empty; a renewal changes no state, so its rows
-- are never announced.
CREATE OR REPLACE FUNCTION agent_run_state_watched() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM agent_run_watch) THEN
        PERFORM pg_notify('agent_run_watch', n.id::text)
            FROM new_runs n
            WHERE EXISTS (SELECT 1 FROM agent_run_watch w WHERE w.run_id = n.id)
              AND NOT EXISTS (SELECT 1 FROM old_runs o WHERE o.id = n.id AND o.state = n.state);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER agent_run_state_watched AFTER UPDATE ON agent_run
    REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs
    FOR EACH STATEMENT EXECUTE FUNCTION agent_run_state_watched();
"""

# No SET clause, so the planner inlines the body into its callers; every name in it is
# pg_catalog's, qualified, so it resolves alike whatever the caller's search_path.
SUBJECT_LOCK = """
CREATE OR REPLACE FUNCTION agent_subject_lock(workspace text, subject text) RETURNS void
LANGUAGE sql
AS $$
    SELECT pg_catalog.pg_advisory_xact_lock(
        pg_catalog.hashtext('agentruns.subject'),
        pg_catalog.hashtext(
            workspace OPERATOR(pg_catalog.||) pg_catalog.chr(31) OPERATOR(pg_catalog.||) subject))
$$;
"""

ROW_STATE_WATCHED = """
DROP TRIGGER agent_run_state_watched ON agent_run;

CREATE OR REPLACE FUNCTION agent_run_state_watched() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM agent_run_watch w WHERE w.run_id = NEW.id) THEN
        PERFORM pg_notify('agent_run_watch', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER agent_run_state_watched AFTER UPDATE ON agent_run
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION agent_run_state_watched();
"""

SET_SUBJECT_LOCK = """
CREATE OR REPLACE FUNCTION agent_subject_lock(workspace text, subject text) RETURNS void
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT pg_advisory_xact_lock(hashtext('agentruns.subject'),
                                 hashtext(workspace || chr(31) || subject))
$$;
"""


def upgrade() -> None:
    op.execute(STATE_WATCHED)
    op.execute(SUBJECT_LOCK)


def downgrade() -> None:
    op.execute(SET_SUBJECT_LOCK)
    op.execute(ROW_STATE_WATCHED)
