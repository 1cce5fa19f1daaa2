-- A run's events: appended under the run's fence, never rewritten, deleted only with their run
-- or once it has ended (ADRs/0016). There is no foreign key to the run: its check locked the run
-- row for every event (about a tenth of a step boundary's cost). The insert guard reads each new
-- event's run to fence it anyway, and refuses an event whose run does not exist; a deleted run's
-- events go with it through agent_run_gone (history.sql), as the key's cascade took them.

CREATE FUNCTION refuse_agent_run_event_rewrite() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'agent_run_event %/%: events are append-only', OLD.run_id, OLD.seq
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_event';
END
$$;

CREATE TRIGGER guard_agent_run_event_rewrite BEFORE UPDATE ON agent_run_event
    FOR EACH ROW EXECUTE FUNCTION refuse_agent_run_event_rewrite();

-- The one rule that reads other rows: an event is fenced to its run's current epoch, and numbered
-- by its run's event count after it (guard_agent_run_event_seq: no 0, no gap, one index probe
-- for the event before it), checked once
-- per statement over the rows it inserted (a group of many step boundaries pays one joined read,
-- not one per event). A run this transaction has written already (the renewal in the same
-- statement) is held by it until commit; any other run is first locked FOR SHARE, so its claim,
-- requeue or end waits for the appender's commit instead of slipping between the check and the
-- commit, and read again. Sequential scans, hash and merge joins are off: one key lookup per new
-- event whatever the group's size and whatever the statistics say (ADRs/0019).
CREATE FUNCTION guard_agent_run_event_insert() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET search_path FROM CURRENT
AS $$
DECLARE
    mine xid := pg_current_xact_id()::xid;
    stale boolean;
    unheld boolean;
    gap boolean;
    wrong record;
BEGIN
    SELECT bool_or(r.id IS NULL OR r.state <> 'leased' OR r.epoch <> a.epoch), bool_or(r.xmin <> mine),
            bool_or(a.seq <> r.events OR a.seq < 1
                OR (a.seq > 1 AND NOT EXISTS (SELECT 1 FROM agent_run_event p
                                              WHERE p.run_id = a.run_id AND p.seq = a.seq - 1)))
        INTO stale, unheld, gap
        FROM added a LEFT JOIN agent_run r ON r.id = a.run_id;
    IF unheld THEN
        PERFORM 1 FROM agent_run r WHERE r.id IN (SELECT a.run_id FROM added a)
            AND r.xmin <> mine FOR SHARE OF r;
        SELECT bool_or(r.id IS NULL OR r.state <> 'leased' OR r.epoch <> a.epoch),
                bool_or(a.seq <> r.events OR a.seq < 1
                    OR (a.seq > 1 AND NOT EXISTS (SELECT 1 FROM agent_run_event p
                                                  WHERE p.run_id = a.run_id AND p.seq = a.seq - 1)))
            INTO stale, gap
            FROM added a LEFT JOIN agent_run r ON r.id = a.run_id;
    END IF;
    IF stale THEN
        SELECT a.run_id, a.epoch, r.state, r.epoch AS run_epoch INTO wrong
            FROM added a LEFT JOIN agent_run r ON r.id = a.run_id
            WHERE r.id IS NULL OR r.state <> 'leased' OR r.epoch <> a.epoch LIMIT 1;
        RAISE EXCEPTION 'agent_run_event: run % is % at epoch %, so no event of epoch % is '
            'appended', wrong.run_id, wrong.state, wrong.run_epoch, wrong.epoch
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_event';
    END IF;
    IF gap THEN
        SELECT a.run_id, a.seq, r.events INTO wrong
            FROM added a JOIN agent_run r ON r.id = a.run_id
            WHERE a.seq <> r.events OR a.seq < 1
                OR (a.seq > 1 AND NOT EXISTS (SELECT 1 FROM agent_run_event p
                                              WHERE p.run_id = a.run_id AND p.seq = a.seq - 1))
            LIMIT 1;
        RAISE EXCEPTION 'agent_run_event: run % has % events, so its next event is numbered '
            'after the last one it has, not %', wrong.run_id, wrong.events, wrong.seq
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_event_seq';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER guard_agent_run_event_insert AFTER INSERT ON agent_run_event
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION guard_agent_run_event_insert();

-- Events go with their run (the run is gone by then) or after it ended: one check per deleting
-- statement, so a purge pays one probe per run.
CREATE FUNCTION guard_agent_run_event_delete() RETURNS trigger LANGUAGE plpgsql
SET jit = off
SET search_path FROM CURRENT
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM gone g JOIN agent_run r ON r.id = g.run_id
               WHERE r.state <> 'ended') THEN
        RAISE EXCEPTION 'agent_run_event: events of a run that has not ended are not deleted'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_event';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER guard_agent_run_event_delete AFTER DELETE ON agent_run_event
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION guard_agent_run_event_delete();
