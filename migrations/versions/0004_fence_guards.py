"""The schema enforces the fence on its own, whoever writes (ADRs/0016).

Revision ID: 0004_fence_guards
Revises: 0006_failure_records

Every rule about a run is a comparison in a BEFORE trigger, of NEW with OLD or of NEW alone, with
no table read; only event inserts read their runs (one joined read per statement), since an event
is fenced to its run's current epoch. Every refusal is a check violation that names its rule:

- ``guard_agent_run_epoch``: a claim (QUEUED -> LEASED) takes exactly the next epoch, and no other
  write changes the epoch.
- ``guard_agent_run_holder``: the holder changes only with a claim, or is cleared by a move back to
  the queue.
- ``guard_agent_run_attempt``: ``attempt`` never goes back, and grows by one only when a lease goes
  back to the queue.
- ``guard_agent_run_frozen``: a run's payload, band, queue order, enqueue time, lease length,
  deadline and continuation are written once, at enqueue (a leased run's above all).
- ``guard_agent_run_delete``: only an ended run is deleted (retention).
- ``guard_agent_run_reason``, ``guard_agent_run_lease``, ``guard_agent_run_queued``,
  ``guard_agent_run_leased``, ``guard_agent_run_ended``: the reason vocabulary, a positive lease,
  and which columns each state fills.
- ``guard_agent_run_event``: an event is appended only to a leased run at its current epoch, never
  rewritten, and deleted only with its run or once its run has ended.
- ``ck_agent_sandbox_*`` and ``guard_agent_sandbox_times``: a sandbox shuts down after its request,
  is first called and last used between its request and its shutdown, and ``ready_at`` and
  ``last_used_at`` never move back.

The sandbox rules are CHECK constraints: that table is off the hot path. Existing sandbox rows
must satisfy them (the adapter never wrote otherwise); adding them reads the table once.
"""

from __future__ import annotations

from alembic import op

revision = "0004_fence_guards"
down_revision = "0006_failure_records"
branch_labels = None
depends_on = None

# 0001's guard, grown by the fence and the rules about one row. A CHECK constraint would be the
# natural home of a rule about one row, but the executor prepares every CHECK expression of the
# table again for each statement (ADRs/0016 has the measurement: the five rules below cost about
# 55 us per renewal as constraints, against about 12 us here), while PL/pgSQL keeps its
# expressions prepared for the session. So one expression accepts a legal write, the path every
# write of the adapter takes; the rules are told apart, in order, only for a write it refuses.
GUARD = """
CREATE OR REPLACE FUNCTION guard_agent_run() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    legal boolean;
    claim boolean;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state = 'queued' AND NEW.lease > interval '0' AND NEW.leased_until IS NULL
                AND NEW.holder IS NULL AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL THEN
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
        RAISE EXCEPTION 'agent_run %: a queued run has no holder, lease or end', NEW.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_queued';
    END IF;
    legal := NEW.id = OLD.id AND NEW.kind = OLD.kind AND NEW.workspace = OLD.workspace
        AND NEW.subject = OLD.subject
        AND ((OLD.state = 'queued' AND NEW.state IN ('leased', 'ended'))
             OR (OLD.state = 'leased' AND NEW.state IN ('leased', 'queued', 'ended')))
        AND NEW.epoch = OLD.epoch + (OLD.state = 'queued' AND NEW.state = 'leased')::integer
        AND (NEW.holder IS NOT DISTINCT FROM OLD.holder OR NEW.state = 'queued'
             OR (OLD.state = 'queued' AND NEW.state = 'leased'))
        AND (NEW.attempt = OLD.attempt
             OR (OLD.state = 'leased' AND NEW.state = 'queued' AND NEW.attempt = OLD.attempt + 1))
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

# Fired only by an UPDATE that names one of these columns: claims, renewals, ends, requeues and
# take-backs name none of them, so they never call it (PostgreSQL decides from the statement's
# target list, before any row is read).
FROZEN = """
CREATE FUNCTION refuse_agent_run_frozen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'agent_run %: a run keeps the payload, band, queue order, enqueue time, '
        'lease, deadline and continuation it was enqueued with (it is %)', OLD.id, OLD.state
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_frozen';
END
$$;

CREATE TRIGGER guard_agent_run_frozen
    BEFORE UPDATE OF payload, band, seq, enqueued_at, lease, deadline_at, continues
    ON agent_run FOR EACH ROW EXECUTE FUNCTION refuse_agent_run_frozen();

CREATE FUNCTION refuse_agent_run_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'agent_run %: only an ended run is deleted, not a % one', OLD.id, OLD.state
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_delete';
END
$$;

CREATE TRIGGER guard_agent_run_delete BEFORE DELETE ON agent_run
    FOR EACH ROW WHEN (OLD.state <> 'ended') EXECUTE FUNCTION refuse_agent_run_delete();
"""

# The one rule that reads other rows: an event is fenced to its run's current epoch. It is checked
# once per statement over the rows it inserted (a group commit of many step boundaries pays one
# joined read, not one per event). A run this transaction has written already (the renewal in the
# same statement) is held by it until commit; any other run is first locked FOR SHARE, so its
# claim, requeue or end waits for the appender's commit instead of slipping between the check and
# the commit, and read again.
EVENTS = """
CREATE FUNCTION refuse_agent_run_event_rewrite() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'agent_run_event %/%: events are append-only', OLD.run_id, OLD.seq
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_event';
END
$$;

CREATE TRIGGER guard_agent_run_event_rewrite BEFORE UPDATE ON agent_run_event
    FOR EACH ROW EXECUTE FUNCTION refuse_agent_run_event_rewrite();

CREATE FUNCTION guard_agent_run_event_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    mine xid := pg_current_xact_id()::xid;
    stale boolean;
    unheld boolean;
    wrong record;
BEGIN
    SELECT bool_or(r.state <> 'leased' OR r.epoch <> a.epoch), bool_or(r.xmin <> mine)
        INTO stale, unheld
        FROM added a JOIN agent_run r ON r.id = a.run_id;
    IF unheld THEN
        PERFORM 1 FROM agent_run r WHERE r.id IN (SELECT a.run_id FROM added a)
            AND r.xmin <> mine FOR SHARE OF r;
        SELECT bool_or(r.state <> 'leased' OR r.epoch <> a.epoch) INTO stale
            FROM added a JOIN agent_run r ON r.id = a.run_id;
    END IF;
    IF stale THEN
        SELECT a.run_id, a.epoch, r.state, r.epoch AS run_epoch INTO wrong
            FROM added a JOIN agent_run r ON r.id = a.run_id
            WHERE r.state <> 'leased' OR r.epoch <> a.epoch LIMIT 1;
        RAISE EXCEPTION 'agent_run_event: run % is % at epoch %, so no event of epoch % is '
            'appended', wrong.run_id, wrong.state, wrong.run_epoch, wrong.epoch
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_event';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER guard_agent_run_event_insert AFTER INSERT ON agent_run_event
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION guard_agent_run_event_insert();

-- Events go with their run (the purge's cascade: the run is gone by then) or after it ended.
-- One check per deleting statement, so a purge pays one probe per run.
CREATE FUNCTION guard_agent_run_event_delete() RETURNS trigger LANGUAGE plpgsql AS $$
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
"""

SANDBOX_CHECKS = """
ALTER TABLE agent_sandbox
    ADD CONSTRAINT ck_agent_sandbox_shutdown CHECK (shutdown_at > requested_at),
    ADD CONSTRAINT ck_agent_sandbox_ready_at CHECK (ready_at IS NULL OR (
        ready_at >= requested_at AND ready_at <= shutdown_at)),
    ADD CONSTRAINT ck_agent_sandbox_last_used CHECK (last_used_at IS NULL OR (
        ready_at IS NOT NULL AND last_used_at >= ready_at AND last_used_at <= shutdown_at));
"""

# As 0002's guard, plus: a first call is recorded once, and the last use never moves back.
SANDBOX_GUARD = """
CREATE OR REPLACE FUNCTION guard_agent_sandbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'requested' THEN
            RAISE EXCEPTION 'agent_sandbox %: a sandbox is inserted requested, not %',
                NEW.id, NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.kind IS DISTINCT FROM OLD.kind
            OR NEW.workspace IS DISTINCT FROM OLD.workspace
            OR NEW.subject IS DISTINCT FROM OLD.subject
            OR NEW.claim_name IS DISTINCT FROM OLD.claim_name
            OR NEW.conversation IS DISTINCT FROM OLD.conversation
            OR NEW.requested_at IS DISTINCT FROM OLD.requested_at
            OR NEW.shutdown_at IS DISTINCT FROM OLD.shutdown_at THEN
        RAISE EXCEPTION 'agent_sandbox %: a sandbox never changes its identity', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
    END IF;
    IF NOT ((OLD.state = 'requested' AND NEW.state IN ('requested', 'ready', 'deleting'))
            OR (OLD.state = 'ready' AND NEW.state IN ('ready', 'deleting'))) THEN
        RAISE EXCEPTION 'agent_sandbox %: illegal transition % -> %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
    END IF;
    IF (OLD.ready_at IS NOT NULL AND NEW.ready_at IS DISTINCT FROM OLD.ready_at)
            OR (OLD.last_used_at IS NOT NULL
                AND (NEW.last_used_at IS NULL OR NEW.last_used_at < OLD.last_used_at)) THEN
        RAISE EXCEPTION 'agent_sandbox %: its first call is kept and its last use never moves '
            'back', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox_times';
    END IF;
    RETURN NEW;
END
$$;
"""

DOWN = """
DROP TRIGGER guard_agent_run_event_delete ON agent_run_event;
DROP FUNCTION guard_agent_run_event_delete();
DROP TRIGGER guard_agent_run_event_insert ON agent_run_event;
DROP FUNCTION guard_agent_run_event_insert();
DROP TRIGGER guard_agent_run_event_rewrite ON agent_run_event;
DROP FUNCTION refuse_agent_run_event_rewrite();
DROP TRIGGER guard_agent_run_delete ON agent_run;
DROP FUNCTION refuse_agent_run_delete();
DROP TRIGGER guard_agent_run_frozen ON agent_run;
DROP FUNCTION refuse_agent_run_frozen();
ALTER TABLE agent_sandbox
    DROP CONSTRAINT ck_agent_sandbox_shutdown,
    DROP CONSTRAINT ck_agent_sandbox_ready_at,
    DROP CONSTRAINT ck_agent_sandbox_last_used;
"""


# 0001's guard and 0002's sandbox guard, which a downgrade restores.
FIRST_GUARD = """
CREATE OR REPLACE FUNCTION guard_agent_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'queued' THEN
            RAISE EXCEPTION 'agent_run %: a run is inserted queued, not %', NEW.id, NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.kind IS DISTINCT FROM OLD.kind
            OR NEW.workspace IS DISTINCT FROM OLD.workspace
            OR NEW.subject IS DISTINCT FROM OLD.subject THEN
        RAISE EXCEPTION 'agent_run %: a run never changes its identity', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run';
    END IF;
    IF NOT ((OLD.state = 'queued' AND NEW.state IN ('leased', 'ended'))
            OR (OLD.state = 'leased' AND NEW.state IN ('leased', 'queued', 'ended'))) THEN
        RAISE EXCEPTION 'agent_run %: illegal transition % -> %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run';
    END IF;
    IF NEW.epoch < OLD.epoch THEN
        RAISE EXCEPTION 'agent_run %: the epoch never goes back (% -> %)',
            OLD.id, OLD.epoch, NEW.epoch
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run';
    END IF;
    RETURN NEW;
END
$$;

"""

FIRST_SANDBOX_GUARD = """
CREATE OR REPLACE FUNCTION guard_agent_sandbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'requested' THEN
            RAISE EXCEPTION 'agent_sandbox %: a sandbox is inserted requested, not %',
                NEW.id, NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.kind IS DISTINCT FROM OLD.kind
            OR NEW.workspace IS DISTINCT FROM OLD.workspace
            OR NEW.subject IS DISTINCT FROM OLD.subject
            OR NEW.claim_name IS DISTINCT FROM OLD.claim_name
            OR NEW.conversation IS DISTINCT FROM OLD.conversation
            OR NEW.requested_at IS DISTINCT FROM OLD.requested_at
            OR NEW.shutdown_at IS DISTINCT FROM OLD.shutdown_at THEN
        RAISE EXCEPTION 'agent_sandbox %: a sandbox never changes its identity', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
    END IF;
    IF NOT ((OLD.state = 'requested' AND NEW.state IN ('requested', 'ready', 'deleting'))
            OR (OLD.state = 'ready' AND NEW.state IN ('ready', 'deleting'))) THEN
        RAISE EXCEPTION 'agent_sandbox %: illegal transition % -> %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
    END IF;
    RETURN NEW;
END
$$;

"""


def upgrade() -> None:
    for block in (GUARD, FROZEN, EVENTS, SANDBOX_CHECKS, SANDBOX_GUARD):
        op.execute(block)


def downgrade() -> None:
    for block in (DOWN, FIRST_GUARD, FIRST_SANDBOX_GUARD):
        op.execute(block)
