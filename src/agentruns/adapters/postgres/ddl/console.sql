-- The console's list and overview (ADRs/0018). Each index on agent_run is partial on one state,
-- so it is written only when a row version enters that state (an enqueue or a requeue for the
-- queued ones, an end for the ended one), never by a claim or a renewal. The console's list
-- merges one branch per state, each read in queue order from these; its overview counts queued
-- runs by an index-only scan of ix_agent_run_queued_console. The ended runs' indexes are on
-- agent_run_history (history.sql): agent_run keeps one, by which the reaper moves its ended runs
-- there and the list reads those not moved yet (ADRs/0035).

CREATE INDEX ix_agent_run_queued_seq ON agent_run (seq) WHERE state = 'queued';
CREATE INDEX ix_agent_run_queued_console ON agent_run (workspace, subject, seq)
    INCLUDE (band, kind, due_at) WHERE state = 'queued';
CREATE INDEX ix_agent_run_ended_seq ON agent_run (seq) WHERE state = 'ended';

-- The waiting runs (ADRs/0025) in the order their waits end: written only by a wait's give-back
-- (a claim, renewal or end makes a row version outside it); the overview counts them per
-- workspace and lists the soonest ends from it alone.
CREATE INDEX ix_agent_run_waits ON agent_run (waiting_until, seq)
    INCLUDE (workspace, kind, subject, waiting_for)
    WHERE state = 'queued' AND waiting_until IS NOT NULL;

-- Failed attempts by time, across runs.
CREATE INDEX ix_agent_run_failure_recorded ON agent_run_failure (recorded_at);
