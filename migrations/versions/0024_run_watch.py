"""Watched runs announce their commits (issue 25, part 4).

Revision ID: 0024_run_watch
Revises: 0023_waiting_offered

- ``agent_run_watch``: one row per watcher of a run (``AgentRuns.watch``), removed by the watcher
  when it stops and with its run by a purge (``ON DELETE CASCADE``).
- ``agent_run_event_watched`` (after each statement that appends events) and
  ``agent_run_state_watched`` (after a row's state changes) send ``NOTIFY agent_run_watch`` with
  the run's id, only for runs that have a watcher: a run nobody watches sends nothing, so the
  worker loop's commits take no notify lock (ADRs/0030).
"""

from __future__ import annotations

from alembic import op

revision = "0024_run_watch"
down_revision = "0023_waiting_offered"
branch_labels = None
depends_on = None

WATCH = """
CREATE TABLE agent_run_watch (
    run_id uuid NOT NULL REFERENCES agent_run (id) ON DELETE CASCADE,
    watcher uuid NOT NULL,
    since timestamp with time zone NOT NULL,
    PRIMARY KEY (run_id, watcher)
);

CREATE FUNCTION agent_run_event_watched() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM agent_run_watch) THEN
        PERFORM pg_notify('agent_run_watch', d.run_id::text)
            FROM (SELECT DISTINCT a.run_id FROM announced a
                  WHERE EXISTS (SELECT 1 FROM agent_run_watch w WHERE w.run_id = a.run_id)) d;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER agent_run_event_watched AFTER INSERT ON agent_run_event
    REFERENCING NEW TABLE AS announced
    FOR EACH STATEMENT EXECUTE FUNCTION agent_run_event_watched();

-- A claim, a give-back, a requeue, a take-back or an end: the renewals of the worker loop change
-- no state, so the condition keeps them from calling the function at all.
CREATE FUNCTION agent_run_state_watched() RETURNS trigger LANGUAGE plpgsql
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


def upgrade() -> None:
    op.execute(WATCH)


def downgrade() -> None:
    op.execute("""
DROP TRIGGER agent_run_state_watched ON agent_run;
DROP FUNCTION agent_run_state_watched();
DROP TRIGGER agent_run_event_watched ON agent_run_event;
DROP FUNCTION agent_run_event_watched();
DROP TABLE agent_run_watch;
""")
