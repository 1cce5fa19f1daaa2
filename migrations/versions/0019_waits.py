"""Durable waits and sleeps: a waiting run is a queued run that is not due (issue 24).

Revision ID: 0019_waits
Revises: 0018_enqueue_keys

- ``agent_run.waiting_for`` (the signal a waiting run waits for; NULL for a sleep) and
  ``agent_run.waiting_until`` (the wait's end, also its ``due_at``): written by a holder's wait
  (a fenced give-back, leased -> queued, no attempt spent), cleared by the signal's wake-up or
  when the resumed wait resolves. Claims, renewals, step boundaries and ends name neither: the
  worker loop reads and writes nothing more (ADRs/0025).
- ``agent_run_signal``: the signals delivered to runs, once per (run, signal id): the unique
  constraint is what makes a retried delivery a no-op. No foreign key to ``agent_run`` (its
  triggers would run on the worker loop's updates); a purge deletes its runs' signals.
- ``guard_agent_run`` (function and condition) allows one more queued -> queued write: a waiting
  run woken by its signal (its wait's end cleared, its head kept, due now). The state table is
  unchanged otherwise.
"""

from __future__ import annotations

from alembic import op

revision = "0019_waits"
down_revision = "0018_enqueue_keys"
branch_labels = None
depends_on = None

WAITS = """
ALTER TABLE agent_run ADD COLUMN waiting_for text;
ALTER TABLE agent_run ADD COLUMN waiting_until timestamp with time zone;

CREATE TABLE agent_run_signal (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id uuid NOT NULL,
    name text NOT NULL,
    signal_id text NOT NULL,
    payload jsonb NOT NULL,
    delivered_at timestamp with time zone NOT NULL,
    CONSTRAINT uq_agent_run_signal_id UNIQUE (run_id, signal_id)
);
"""

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
                AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
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
        CASE NEW.state WHEN 'leased' THEN 'a holder and a lease, and no end'
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
                AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
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
                AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
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
        CASE NEW.state WHEN 'leased' THEN 'a holder and a lease, and no end'
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
                AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
            WHEN 'queued' THEN NEW.leased_until IS NULL AND NEW.holder IS NULL
                AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
            ELSE NEW.ended_at IS NOT NULL AND NEW.leased_until IS NULL
                AND NEW.end_reason IN ('completed', 'cancelled', 'failed', 'retries_exhausted', 'not_retryable', 'deadline_exceeded', 'continued') END, false))
    EXECUTE FUNCTION guard_agent_run();
"""


def upgrade() -> None:
    op.execute(WAITS)
    op.execute(GUARD)
    op.execute(GUARD_TRIGGER)


def downgrade() -> None:
    op.execute(PREVIOUS_GUARD_TRIGGER)
    op.execute(PREVIOUS_GUARD)
    op.execute("DROP TABLE agent_run_signal;")
    op.execute("ALTER TABLE agent_run DROP COLUMN waiting_until, DROP COLUMN waiting_for;")
