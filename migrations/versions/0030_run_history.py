"""Ended runs move out of the hot table, to agent_run_history (ADRs/0035).

Revision ID: 0030_run_history
Revises: 0029_state_watched_per_statement

A run still ends in ``agent_run`` (the guard, the lanes' ledger, the subject's promotion and a
host's triggers see the same UPDATE as before); the reaper then moves ended runs, in batches, to
``agent_run_history`` (``agent_run_archive``), where the console's ended-run indexes and the
purge's end-time index now are. ``agent_run`` keeps one index of its ended runs, the mover's. A run
is in one table at a time; ``agent_run_all`` is the two tables' union, which every reader of a run
that may have ended reads.

The foreign keys of ``agent_run_failure`` and ``agent_run_watch`` go (a move deletes the run from
``agent_run``): ``agent_run_gone``, now on both tables, deletes a purged run's failures and
watchers with its events, and keeps them when the run only moved.

The data: every ended run moves now, in this revision's transaction, unless a host table has a
foreign key to ``agent_run`` (then none moves, now or later, until the host drops it).

Downgrading moves every run of the history back (the row triggers of ``agent_run`` disabled for
the copy: they refuse to insert an ended run), and restores the keys, the indexes and the old
``agent_run_gone``.
"""

from __future__ import annotations

from alembic import op

revision = "0030_run_history"
down_revision = "0029_state_watched_per_statement"
branch_labels = None
depends_on = None

HISTORY_TABLE = """
CREATE TABLE agent_run_history (
    id uuid NOT NULL,
    kind text NOT NULL,
    workspace text NOT NULL,
    subject text NOT NULL,
    band smallint NOT NULL,
    payload jsonb NOT NULL,
    state text NOT NULL,
    epoch integer NOT NULL,
    attempt integer NOT NULL,
    seq bigint NOT NULL,
    enqueued_at timestamp with time zone NOT NULL,
    due_at timestamp with time zone NOT NULL,
    lease interval NOT NULL,
    deadline_at timestamp with time zone,
    leased_until timestamp with time zone,
    holder text,
    end_reason text,
    ended_at timestamp with time zone,
    continues uuid,
    domain_row boolean DEFAULT false NOT NULL,
    trace_context jsonb,
    last_error_type text,
    last_error text,
    last_failure_class text,
    head boolean DEFAULT false NOT NULL,
    claimed_at timestamp with time zone,
    events integer DEFAULT 0 NOT NULL,
    enqueue_key text,
    waiting_for text,
    waiting_until timestamp with time zone,
    waiting_since timestamp with time zone,
    result jsonb,
    parked boolean DEFAULT false NOT NULL,
    input_tokens bigint DEFAULT 0 NOT NULL,
    output_tokens bigint DEFAULT 0 NOT NULL,
    cost numeric DEFAULT 0 NOT NULL,
    PRIMARY KEY (id),
    CONSTRAINT ck_agent_run_history_ended CHECK (state = 'ended' AND end_reason IS NOT NULL
        AND ended_at IS NOT NULL AND leased_until IS NULL AND NOT head)
);

ALTER TABLE agent_run_failure DROP CONSTRAINT agent_run_failure_run_id_fkey;
ALTER TABLE agent_run_watch DROP CONSTRAINT agent_run_watch_run_id_fkey;
"""

HISTORY = """
CREATE INDEX ix_agent_run_history_seq ON agent_run_history (seq);
CREATE INDEX ix_agent_run_history_workspace ON agent_run_history (workspace, seq);
CREATE INDEX ix_agent_run_history_subject ON agent_run_history (workspace, subject, seq);
CREATE INDEX ix_agent_run_history_unsuccessful ON agent_run_history (end_reason, seq)
    WHERE end_reason <> 'completed';
-- Retention: purge takes ended runs by their end time.
CREATE INDEX ix_agent_run_history_ended_at ON agent_run_history (ended_at);
-- `runs retry` finds a run's continuation, which may have ended too.
CREATE INDEX ix_agent_run_history_continues ON agent_run_history (continues)
    WHERE continues IS NOT NULL;

-- Every run, wherever it is. A query on it runs on each table (an Append), its conditions pushed
-- into both; a state other than 'ended' leaves the history out by its CHECK (constraint
-- exclusion, on by default for a UNION ALL).
CREATE VIEW agent_run_all AS
    SELECT id, kind, workspace, subject, band, payload, state, epoch, attempt, seq, enqueued_at,
           due_at, lease, deadline_at, leased_until, holder, end_reason, ended_at, continues,
           domain_row, trace_context, last_error_type, last_error, last_failure_class, head,
           claimed_at, events, enqueue_key, waiting_for, waiting_until, waiting_since, result,
           parked, input_tokens, output_tokens, cost
    FROM agent_run
    UNION ALL
    SELECT id, kind, workspace, subject, band, payload, state, epoch, attempt, seq, enqueued_at,
           due_at, lease, deadline_at, leased_until, holder, end_reason, ended_at, continues,
           domain_row, trace_context, last_error_type, last_error, last_failure_class, head,
           claimed_at, events, enqueue_key, waiting_for, waiting_until, waiting_since, result,
           parked, input_tokens, output_tokens, cost
    FROM agent_run_history;

-- Up to p_limit ended runs (all of them for NULL), first in queue order, leave agent_run for
-- agent_run_history in one statement; rows another mover holds are skipped, so replicas share
-- the work. A host table with a foreign key to agent_run (a domain row that references its run)
-- keeps every run where it is: the delete would take the host's rows with it (ON DELETE
-- CASCADE) or be refused. Such a host keeps its ended runs in agent_run, as before this table,
-- until it drops the key (ADRs/0035).
CREATE FUNCTION agent_run_archive(p_limit integer) RETURNS integer LANGUAGE sql
SET jit = off
SET search_path FROM CURRENT
AS $$
    WITH doomed AS (
        SELECT r.id FROM agent_run r
        WHERE r.state = 'ended'
          AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint k
                          WHERE k.confrelid = 'agent_run'::regclass AND k.contype = 'f')
        ORDER BY r.seq LIMIT p_limit
        FOR UPDATE OF r SKIP LOCKED
    ),
    moved AS (
        DELETE FROM agent_run r WHERE r.id = ANY (ARRAY(SELECT d.id FROM doomed d))
        RETURNING r.*
    ),
    kept AS (
        INSERT INTO agent_run_history (
            id, kind, workspace, subject, band, payload, state, epoch, attempt, seq, enqueued_at,
            due_at, lease, deadline_at, leased_until, holder, end_reason, ended_at, continues,
            domain_row, trace_context, last_error_type, last_error, last_failure_class, head,
            claimed_at, events, enqueue_key, waiting_for, waiting_until, waiting_since, result,
            parked, input_tokens, output_tokens, cost)
        SELECT id, kind, workspace, subject, band, payload, state, epoch, attempt, seq,
               enqueued_at, due_at, lease, deadline_at, leased_until, holder, end_reason,
               ended_at, continues, domain_row, trace_context, last_error_type, last_error,
               last_failure_class, head, claimed_at, events, enqueue_key, waiting_for,
               waiting_until, waiting_since, result, parked, input_tokens, output_tokens, cost
        FROM moved ORDER BY seq
        RETURNING 1
    )
    SELECT count(*)::integer FROM kept
$$;

-- An ended run is final where it rests: nothing rewrites it.
CREATE FUNCTION refuse_agent_run_history_rewrite() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'agent_run_history %: an ended run is never rewritten', OLD.id
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_history';
END
$$;

CREATE TRIGGER guard_agent_run_history_rewrite BEFORE UPDATE ON agent_run_history
    FOR EACH ROW EXECUTE FUNCTION refuse_agent_run_history_rewrite();

-- A run is in one table at a time: a row comes here only as its run leaves agent_run, in the
-- same statement (the move), never as a copy of a run agent_run still has. One key probe per
-- row moved, once per statement (a lateral lookup, as agent_run_gone's below).
CREATE FUNCTION guard_agent_run_history_insert() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET search_path FROM CURRENT
AS $$
DECLARE
    twin uuid;
BEGIN
    SELECT a.id INTO twin FROM arrived a
        CROSS JOIN LATERAL (SELECT r.id FROM agent_run r WHERE r.id = a.id LIMIT 1) r
        LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'agent_run_history %: the run is still in agent_run; a run moves here '
            'only as it leaves agent_run (agent_run_archive)', twin
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_history';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER guard_agent_run_history_insert AFTER INSERT ON agent_run_history
    REFERENCING NEW TABLE AS arrived
    FOR EACH STATEMENT EXECUTE FUNCTION guard_agent_run_history_insert();

-- A run deleted for good (a purge of either table, or an operator's DELETE of ended runs) takes
-- its events, failed attempts and watchers with it; a run moved to agent_run_history keeps them.
-- Once per deleting statement, one key probe of the history per run deleted from agent_run,
-- written as a lateral lookup with sequential scans, hash and merge joins off: as an anti-join
-- (NOT EXISTS) the plan PL/pgSQL cached on the statement's first run, made while the history was
-- empty, read more of the history per run the larger it grew (a batch of 500 moved runs took 50
-- ms with 500 runs in the history, 960 ms with 9,500: `python -m bench.cpu_split`).
CREATE OR REPLACE FUNCTION agent_run_gone() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET search_path FROM CURRENT
AS $$
DECLARE
    purged uuid[];
BEGIN
    IF TG_TABLE_NAME = 'agent_run' THEN
        purged := ARRAY(SELECT g.id FROM gone_runs g
                        LEFT JOIN LATERAL (SELECT h.id FROM agent_run_history h
                                           WHERE h.id = g.id LIMIT 1) h ON true
                        WHERE h.id IS NULL);
    ELSE
        purged := ARRAY(SELECT g.id FROM gone_runs g);
    END IF;
    IF cardinality(purged) > 0 THEN
        DELETE FROM agent_run_event e WHERE e.run_id = ANY (purged);
        DELETE FROM agent_run_failure f WHERE f.run_id = ANY (purged);
        DELETE FROM agent_run_watch w WHERE w.run_id = ANY (purged);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER agent_run_history_gone AFTER DELETE ON agent_run_history
    REFERENCING OLD TABLE AS gone_runs
    FOR EACH STATEMENT EXECUTE FUNCTION agent_run_gone();
"""

MOVE = """
SELECT agent_run_archive(NULL);

DROP INDEX ix_agent_run_ended_at;
DROP INDEX ix_agent_run_ended_workspace;
DROP INDEX ix_agent_run_ended_subject;
DROP INDEX ix_agent_run_ended_unsuccessful;
"""

BACK = """
CREATE INDEX ix_agent_run_ended_at ON agent_run (ended_at) WHERE state = 'ended';
CREATE INDEX ix_agent_run_ended_workspace ON agent_run (workspace, seq) WHERE state = 'ended';
CREATE INDEX ix_agent_run_ended_subject ON agent_run (workspace, subject, seq)
    WHERE state = 'ended';
CREATE INDEX ix_agent_run_ended_unsuccessful ON agent_run (end_reason, seq)
    WHERE state = 'ended' AND end_reason <> 'completed';

DROP TRIGGER agent_run_history_gone ON agent_run_history;
DROP TRIGGER guard_agent_run_history_insert ON agent_run_history;
DROP TRIGGER guard_agent_run_history_rewrite ON agent_run_history;
ALTER TABLE agent_run DISABLE TRIGGER USER;
INSERT INTO agent_run (
    id, kind, workspace, subject, band, payload, state, epoch, attempt, seq, enqueued_at,
    due_at, lease, deadline_at, leased_until, holder, end_reason, ended_at, continues,
    domain_row, trace_context, last_error_type, last_error, last_failure_class, head,
    claimed_at, events, enqueue_key, waiting_for, waiting_until, waiting_since, result,
    parked, input_tokens, output_tokens, cost)
SELECT id, kind, workspace, subject, band, payload, state, epoch, attempt, seq, enqueued_at,
       due_at, lease, deadline_at, leased_until, holder, end_reason, ended_at, continues,
       domain_row, trace_context, last_error_type, last_error, last_failure_class, head,
       claimed_at, events, enqueue_key, waiting_for, waiting_until, waiting_since, result,
       parked, input_tokens, output_tokens, cost
FROM agent_run_history ORDER BY seq;
ALTER TABLE agent_run ENABLE TRIGGER USER;

DROP FUNCTION agent_run_archive(integer);
DROP VIEW agent_run_all;
DROP TABLE agent_run_history;
DROP FUNCTION guard_agent_run_history_insert();
DROP FUNCTION refuse_agent_run_history_rewrite();

CREATE OR REPLACE FUNCTION agent_run_gone() RETURNS trigger LANGUAGE plpgsql
SET jit = off
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM agent_run_event e WHERE e.run_id IN (SELECT g.id FROM gone_runs g);
    RETURN NULL;
END
$$;

ALTER TABLE agent_run_failure ADD CONSTRAINT agent_run_failure_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES agent_run (id) ON DELETE CASCADE;
ALTER TABLE agent_run_watch ADD CONSTRAINT agent_run_watch_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES agent_run (id) ON DELETE CASCADE;
"""


def upgrade() -> None:
    op.execute(HISTORY_TABLE)
    op.execute(HISTORY)
    op.execute(MOVE)


def downgrade() -> None:
    op.execute(BACK)
