-- Watched runs announce their commits on channel agent_run_watch (ADRs/0030). A watcher's row in
-- agent_run_watch asks for it; a run nobody watches announces nothing, so the worker loop pays no
-- NOTIFY (whose commit takes a lock every notifying transaction of the server waits on): an
-- appending or updating statement pays one test that the table is empty.
-- The payload is the run's id only; a watcher reads what changed (a notification is a hint).

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

-- A claim, a give-back, a requeue, a take-back or an end, once per updating statement: nobody
-- watching costs one test that agent_run_watch is empty; a renewal changes no state, so its rows
-- are never announced.
CREATE FUNCTION agent_run_state_watched() RETURNS trigger LANGUAGE plpgsql
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
