"""A merge's debounce moves a queued run that was never claimed later (ADRs/0031).

Revision ID: 0025_merge
Revises: 0024_run_watch

``guard_agent_run`` admits one more queued -> queued write: a run at epoch 0 (never claimed),
not waiting, made due strictly later than it was, its head flag unchanged. The merge itself
(the new work joining the run) writes a signal, which needs no change. The function and its trigger's
condition are written whole; the downgrade writes revision 0023's text back.
"""

from __future__ import annotations

from alembic import op

revision = "0025_merge"
down_revision = "0024_run_watch"
branch_labels = None
depends_on = None

GUARD = """
CREATE OR REPLACE FUNCTION guard_agent_run() RETURNS trigger LANGUAGE plpgsql
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
"""

GUARD_TRIGGER = """
CREATE OR REPLACE TRIGGER guard_agent_run BEFORE UPDATE ON agent_run FOR EACH ROW
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
"""

PREVIOUS_GUARD = """
CREATE OR REPLACE FUNCTION guard_agent_run() RETURNS trigger LANGUAGE plpgsql
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
"""

PREVIOUS_GUARD_TRIGGER = """
CREATE OR REPLACE TRIGGER guard_agent_run BEFORE UPDATE ON agent_run FOR EACH ROW
    WHEN (NOT COALESCE(NEW.id = OLD.id AND NEW.kind = OLD.kind AND NEW.workspace = OLD.workspace
        AND NEW.subject = OLD.subject
        AND ((OLD.state = 'queued' AND NEW.state IN ('leased', 'ended'))
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head AND NOT OLD.head)
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head = OLD.head
                 AND OLD.waiting_until IS NOT NULL AND NEW.waiting_until IS NULL)
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head = OLD.head
                 AND OLD.parked AND NOT NEW.parked
                 AND NEW.waiting_until IS NOT DISTINCT FROM OLD.waiting_until)
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
"""


def upgrade() -> None:
    op.execute(GUARD)
    op.execute(GUARD_TRIGGER)


def downgrade() -> None:
    op.execute(PREVIOUS_GUARD_TRIGGER)
    op.execute(PREVIOUS_GUARD)
