-- The fence, whoever writes (ADRs/0016): every rule about one run is a comparison of NEW with
-- OLD or of NEW alone, with no table read. A CHECK constraint would be the natural home of a rule
-- about one row, but the executor prepares every CHECK expression of the table again for each
-- statement, while PL/pgSQL keeps its expressions prepared for the session; and PL/pgSQL is only
-- called for a write the trigger's WHEN condition refuses (ADRs/0019), so the legal writes every
-- adapter statement makes cost the executor's evaluation of that condition alone.
--
-- Refusals are check violations named after their rule:
--   guard_agent_run            the state table (queued -> leased | ended, leased -> leased |
--                              queued | ended, queued -> queued only to become the head, to
--                              wake from a wait (ADRs/0025), to offer a parked wait again
--                              (ADRs/0029), or, never claimed, to be due later (a merge's
--                              debounce, ADRs/0031); a leased run is never parked) and the
--                              run's identity (id, kind, workspace, subject);
--   guard_agent_run_epoch      a claim takes exactly the next epoch; nothing else changes it;
--   guard_agent_run_holder     the holder changes only with a claim, or is cleared by a requeue;
--   guard_agent_run_attempt    an attempt is spent only by a lease going back to the queue;
--   guard_agent_run_reason     the vocabulary of end reasons;
--   guard_agent_run_lease      a lease is longer than zero;
--   guard_agent_run_queued / _leased / _ended   which columns each state fills;
--   guard_agent_run_frozen     payload, band, queue order, enqueue time, lease, deadline,
--                              continuation and enqueue key are written once, at enqueue;
--   guard_agent_run_events     a run is inserted with no events, and its event count moves
--                              only by one, on a leased run (an event appended: ADRs/0016);
--   guard_agent_run_delete     only an ended run is deleted (retention), by DELETE or TRUNCATE;
--   guard_agent_run_result     a result only on an ended run (written with its end: ADRs/0026).

-- One expression accepts a legal write (the triggers' WHEN conditions below are its two halves);
-- the rules are told apart, in order, only for a write it refuses.
CREATE FUNCTION guard_agent_run() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    legal boolean;
    claim boolean;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state = 'queued' AND NEW.lease > interval '0' AND NEW.leased_until IS NULL
                AND NEW.holder IS NULL AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
                AND NEW.events = 0 THEN
            RETURN NEW;
        END IF;
        IF NEW.state IS DISTINCT FROM 'queued' THEN
            RAISE EXCEPTION 'agent_run %: a run is inserted queued, not %', NEW.id, NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run';
        END IF;
        IF NOT NEW.lease > interval '0' THEN
            RAISE EXCEPTION 'agent_run %: a lease is longer than zero, not %', NEW.id, NEW.lease
                USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_lease';
        END IF;
        IF NEW.events IS DISTINCT FROM 0 THEN
            RAISE EXCEPTION 'agent_run %: a run is inserted with no events, not %', NEW.id,
                NEW.events
                USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_events';
        END IF;
        RAISE EXCEPTION 'agent_run %: a queued run has no holder, lease or end', NEW.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_queued';
    END IF;
    legal := NEW.id = OLD.id AND NEW.kind = OLD.kind AND NEW.workspace = OLD.workspace
        AND NEW.subject = OLD.subject
        AND ((OLD.state = 'queued' AND NEW.state IN ('leased', 'ended'))
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head AND NOT OLD.head)
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head = OLD.head
                 AND OLD.waiting_until IS NOT NULL AND NEW.waiting_until IS NULL)
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head = OLD.head
                 AND OLD.parked AND NOT NEW.parked
                 AND NEW.waiting_until IS NOT DISTINCT FROM OLD.waiting_until)
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head = OLD.head
                 AND OLD.epoch = 0 AND OLD.waiting_until IS NULL AND NEW.waiting_until IS NULL
                 AND NEW.due_at > OLD.due_at)
             OR (OLD.state = 'leased' AND NEW.state IN ('leased', 'queued', 'ended')))
        AND NEW.epoch = OLD.epoch + (OLD.state = 'queued' AND NEW.state = 'leased')::integer
        AND (NEW.holder IS NOT DISTINCT FROM OLD.holder OR NEW.state = 'queued'
             OR (OLD.state = 'queued' AND NEW.state = 'leased'))
        AND (NEW.attempt = OLD.attempt
             OR (OLD.state = 'leased' AND NEW.state = 'queued' AND NEW.attempt = OLD.attempt + 1))
        AND (NEW.events = OLD.events
             OR (NEW.events = OLD.events + 1 AND OLD.state = 'leased' AND NEW.state = 'leased'))
        AND CASE NEW.state
            WHEN 'leased' THEN NEW.leased_until IS NOT NULL AND NEW.holder IS NOT NULL
                AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL AND NOT NEW.parked
            WHEN 'queued' THEN NEW.leased_until IS NULL AND NEW.holder IS NULL
                AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
            ELSE NEW.ended_at IS NOT NULL AND NEW.leased_until IS NULL
                AND NEW.end_reason IN ('completed', 'cancelled', 'failed', 'retries_exhausted', 'not_retryable', 'deadline_exceeded', 'continued') END;
    IF legal THEN
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.kind IS DISTINCT FROM OLD.kind
            OR NEW.workspace IS DISTINCT FROM OLD.workspace
            OR NEW.subject IS DISTINCT FROM OLD.subject THEN
        RAISE EXCEPTION 'agent_run %: a run never changes its identity', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run';
    END IF;
    IF NOT ((OLD.state = 'queued' AND NEW.state IN ('leased', 'ended'))
            OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head AND NOT OLD.head)
            OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head = OLD.head
                AND OLD.waiting_until IS NOT NULL AND NEW.waiting_until IS NULL)
            OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head = OLD.head
                AND OLD.parked AND NOT NEW.parked
                AND NEW.waiting_until IS NOT DISTINCT FROM OLD.waiting_until)
            OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head = OLD.head
                AND OLD.epoch = 0 AND OLD.waiting_until IS NULL AND NEW.waiting_until IS NULL
                AND NEW.due_at > OLD.due_at)
            OR (OLD.state = 'leased' AND NEW.state IN ('leased', 'queued', 'ended'))) THEN
        RAISE EXCEPTION 'agent_run %: illegal transition % -> %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run';
    END IF;
    claim := OLD.state = 'queued' AND NEW.state = 'leased';
    IF NEW.epoch IS DISTINCT FROM OLD.epoch + claim::integer THEN
        RAISE EXCEPTION 'agent_run %: a claim takes the next epoch and nothing else changes it '
            '(% -> % on % -> %)', OLD.id, OLD.epoch, NEW.epoch, OLD.state, NEW.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_epoch';
    END IF;
    IF NEW.holder IS DISTINCT FROM OLD.holder AND NOT claim AND NEW.state <> 'queued' THEN
        RAISE EXCEPTION 'agent_run %: the holder changes only with a claim', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_holder';
    END IF;
    IF NEW.attempt IS DISTINCT FROM OLD.attempt THEN
        RAISE EXCEPTION 'agent_run %: an attempt is spent only by a lease going back to the '
            'queue, one at a time (% -> %)', OLD.id, OLD.attempt, NEW.attempt
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_attempt';
    END IF;
    IF NEW.events IS DISTINCT FROM OLD.events THEN
        RAISE EXCEPTION 'agent_run %: the event count moves only by one event appended to a '
            'leased run (% -> % on % -> %)', OLD.id, OLD.events, NEW.events, OLD.state, NEW.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_events';
    END IF;
    IF NEW.state = 'ended' AND NEW.end_reason IS NOT NULL
            AND NEW.end_reason NOT IN ('completed', 'cancelled', 'failed', 'retries_exhausted', 'not_retryable', 'deadline_exceeded', 'continued') THEN
        RAISE EXCEPTION 'agent_run %: % is no reason to end a run', OLD.id, NEW.end_reason
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_reason';
    END IF;
    RAISE EXCEPTION 'agent_run %: a % run has %', OLD.id, NEW.state,
        CASE NEW.state WHEN 'leased' THEN 'a holder and a lease, no end, and no parked wait'
                       WHEN 'queued' THEN 'no holder, lease or end'
                       ELSE 'a reason and an end time, and no lease' END
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_' || NEW.state;
END
$$;

-- The function's own tests of a legal update and a legal insert, as the conditions: it is called
-- only when the verdict is false or NULL.
CREATE TRIGGER guard_agent_run BEFORE UPDATE ON agent_run FOR EACH ROW
    WHEN (NOT COALESCE(NEW.id = OLD.id AND NEW.kind = OLD.kind AND NEW.workspace = OLD.workspace
        AND NEW.subject = OLD.subject
        AND ((OLD.state = 'queued' AND NEW.state IN ('leased', 'ended'))
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head AND NOT OLD.head)
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head = OLD.head
                 AND OLD.waiting_until IS NOT NULL AND NEW.waiting_until IS NULL)
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head = OLD.head
                 AND OLD.parked AND NOT NEW.parked
                 AND NEW.waiting_until IS NOT DISTINCT FROM OLD.waiting_until)
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head = OLD.head
                 AND OLD.epoch = 0 AND OLD.waiting_until IS NULL AND NEW.waiting_until IS NULL
                 AND NEW.due_at > OLD.due_at)
             OR (OLD.state = 'leased' AND NEW.state IN ('leased', 'queued', 'ended')))
        AND NEW.epoch = OLD.epoch + (OLD.state = 'queued' AND NEW.state = 'leased')::integer
        AND (NEW.holder IS NOT DISTINCT FROM OLD.holder OR NEW.state = 'queued'
             OR (OLD.state = 'queued' AND NEW.state = 'leased'))
        AND (NEW.attempt = OLD.attempt
             OR (OLD.state = 'leased' AND NEW.state = 'queued' AND NEW.attempt = OLD.attempt + 1))
        AND (NEW.events = OLD.events
             OR (NEW.events = OLD.events + 1 AND OLD.state = 'leased' AND NEW.state = 'leased'))
        AND CASE NEW.state
            WHEN 'leased' THEN NEW.leased_until IS NOT NULL AND NEW.holder IS NOT NULL
                AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL AND NOT NEW.parked
            WHEN 'queued' THEN NEW.leased_until IS NULL AND NEW.holder IS NULL
                AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
            ELSE NEW.ended_at IS NOT NULL AND NEW.leased_until IS NULL
                AND NEW.end_reason IN ('completed', 'cancelled', 'failed', 'retries_exhausted', 'not_retryable', 'deadline_exceeded', 'continued') END, false))
    EXECUTE FUNCTION guard_agent_run();
CREATE TRIGGER guard_agent_run_insert BEFORE INSERT ON agent_run FOR EACH ROW
    WHEN (NOT COALESCE(NEW.state = 'queued' AND NEW.lease > interval '0' AND NEW.leased_until IS NULL
                AND NEW.holder IS NULL AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
                AND NEW.events = 0, false))
    EXECUTE FUNCTION guard_agent_run();

-- Fired only by an UPDATE that names one of these columns: claims, renewals, ends, requeues and
-- take-backs name none of them, so they never call it (PostgreSQL decides from the statement's
-- target list, before any row is read).
CREATE FUNCTION refuse_agent_run_frozen() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'agent_run %: a run keeps the payload, band, queue order, enqueue time, '
        'lease, deadline, continuation and enqueue key it was enqueued with (it is %)', OLD.id,
        OLD.state
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_frozen';
END
$$;

CREATE TRIGGER guard_agent_run_frozen
    BEFORE UPDATE OF payload, band, seq, enqueued_at, lease, deadline_at, continues, enqueue_key
    ON agent_run FOR EACH ROW EXECUTE FUNCTION refuse_agent_run_frozen();

CREATE FUNCTION refuse_agent_run_delete() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'agent_run %: only an ended run is deleted, not a % one', OLD.id, OLD.state
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_delete';
END
$$;

CREATE TRIGGER guard_agent_run_delete BEFORE DELETE ON agent_run
    FOR EACH ROW WHEN (OLD.state <> 'ended') EXECUTE FUNCTION refuse_agent_run_delete();

-- Fired only by an insert, or an update that names the result (an end's), with a result on a run
-- that is not ended; an ended run is never updated (guard_agent_run), so its result is final.
CREATE FUNCTION refuse_agent_run_result() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'agent_run %: a result is written with the run''s end, not on a % run',
        NEW.id, NEW.state
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_result';
END
$$;

CREATE TRIGGER guard_agent_run_result
    BEFORE INSERT OR UPDATE OF result ON agent_run FOR EACH ROW
    WHEN (NEW.result IS NOT NULL AND NEW.state <> 'ended')
    EXECUTE FUNCTION refuse_agent_run_result();

-- TRUNCATE fires no row trigger: it is refused by a statement trigger while any run has not ended
-- (agent_run, and the CASCADE that names it), or while a run that has not ended has events
-- (agent_run_event). Only TRUNCATE calls them.
CREATE FUNCTION refuse_agent_run_truncate() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_TABLE_NAME = 'agent_run' AND EXISTS (SELECT 1 FROM agent_run WHERE state <> 'ended') THEN
        RAISE EXCEPTION 'agent_run: only ended runs are deleted, and TRUNCATE would delete runs '
            'that have not ended'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_delete';
    END IF;
    IF TG_TABLE_NAME = 'agent_run_event'
            AND EXISTS (SELECT 1 FROM agent_run WHERE state <> 'ended' AND events > 0) THEN
        RAISE EXCEPTION 'agent_run_event: events of a run that has not ended are not deleted'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_event';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER guard_agent_run_truncate BEFORE TRUNCATE ON agent_run
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_agent_run_truncate();
CREATE TRIGGER guard_agent_run_event_truncate BEFORE TRUNCATE ON agent_run_event
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_agent_run_truncate();
