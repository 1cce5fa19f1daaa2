-- The runs that ended, out of the hot table (ADRs/0035).
--
-- A run ends in agent_run, as it always did: an UPDATE that the fence guard, the lanes' ledger,
-- the subject's promotion and a host's triggers see. The reaper then moves ended runs to
-- agent_run_history in batches (agent_run_archive): one statement deletes them from agent_run and
-- inserts them here, so a run is in one table at a time, and agent_run_all, the two tables'
-- union, is what every reader of a run that may have ended reads. agent_run keeps one index of
-- its ended runs, the mover's (ix_agent_run_ended_seq, ddl/runs.sql); the console's ended-run
-- indexes and the purge's end-time index are here, written in bulk by the move, never by a
-- claim, a step or an end.

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
CREATE FUNCTION agent_run_gone() RETURNS trigger LANGUAGE plpgsql
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

CREATE TRIGGER agent_run_gone AFTER DELETE ON agent_run REFERENCING OLD TABLE AS gone_runs
    FOR EACH STATEMENT EXECUTE FUNCTION agent_run_gone();
CREATE TRIGGER agent_run_history_gone AFTER DELETE ON agent_run_history
    REFERENCING OLD TABLE AS gone_runs
    FOR EACH STATEMENT EXECUTE FUNCTION agent_run_gone();
