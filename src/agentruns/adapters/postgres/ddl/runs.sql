-- The runs' queue order, and their indexes off the claim path (the claim's are in lanes.sql, the
-- console's in console.sql, the ended runs' in history.sql).

-- The sequence of the column's default goes with the column.
ALTER SEQUENCE agent_run_seq OWNED BY agent_run.seq;

-- The reaper ends queued runs past their deadline.
CREATE INDEX ix_agent_run_queued_deadline ON agent_run (deadline_at)
    WHERE state = 'queued' AND deadline_at IS NOT NULL;
-- `runs retry` finds a run's continuation (only continuations have entries).
CREATE INDEX ix_agent_run_continues ON agent_run (continues) WHERE continues IS NOT NULL;
-- A run's failed attempts, in order (ADRs/0014).
CREATE INDEX ix_agent_run_failure_run ON agent_run_failure (run_id, id);
