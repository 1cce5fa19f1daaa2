"""The raw writes the schema still accepted (issue 27): event numbers, the event count,
TRUNCATE, a live sandbox's DELETE.

Revision ID: 0017_edge_guards
Revises: 0016_holders

An adversarial pass wrote 64 illegal rows by raw SQL and PostgreSQL accepted 7 (ADRs/0016,
addendum of issue 27):

- ``guard_agent_run`` (function and both conditions) now keeps ``agent_run.events``: a run is
  inserted with 0, and an update moves it by one at most, on a leased run that stays leased (the
  append of one event), refused as ``guard_agent_run_events``. The conditions grow by a few
  comparisons of columns the row already holds.
- ``guard_agent_run_event_insert`` numbers each event by its run's count after it: ``seq`` equals
  ``agent_run.events``, is at least 1, and the event before it exists (one probe of
  ``uq_agent_run_event_seq`` per event, in the statement's one joined read), refused as
  ``guard_agent_run_event_seq``.
- ``TRUNCATE agent_run`` (or a ``CASCADE`` reaching it) is refused while a run has not ended, and
  ``TRUNCATE agent_run_event`` while a run that has not ended has events: statement triggers,
  called by TRUNCATE only.
- A sandbox row is deleted only once ``deleting`` (``guard_agent_sandbox_delete``, a row trigger
  whose condition keeps the reaper's delete from calling it).

Moving ``leased_until`` into the past stays legal: it is how an operator hands a lease to the
reaper now (ADRs/0016, addendum).
"""

from __future__ import annotations

from alembic import op

revision = "0017_edge_guards"
down_revision = "0016_holders"
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

GUARD_TRIGGERS = """
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
CREATE OR REPLACE TRIGGER guard_agent_run_insert BEFORE INSERT ON agent_run FOR EACH ROW
    WHEN (NOT COALESCE(NEW.state = 'queued' AND NEW.lease > interval '0' AND NEW.leased_until IS NULL
                AND NEW.holder IS NULL AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
                AND NEW.events = 0, false))
    EXECUTE FUNCTION guard_agent_run();
"""

EVENT_GUARD = """
CREATE OR REPLACE FUNCTION guard_agent_run_event_insert() RETURNS trigger LANGUAGE plpgsql
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
"""

TRUNCATE = """
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
"""

SANDBOX_DELETE = """
-- A live sandbox's row is its claim's owner: it is deleted only once it is being deleted (the
-- reaper's last step), so the row never goes while its Pod may still run. The condition keeps
-- the reaper's own delete from calling the function.
CREATE FUNCTION refuse_agent_sandbox_delete() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'agent_sandbox %: only a deleting sandbox is deleted, not a % one', OLD.id,
        OLD.state
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox_delete';
END
$$;

CREATE TRIGGER guard_agent_sandbox_delete BEFORE DELETE ON agent_sandbox
    FOR EACH ROW WHEN (OLD.state <> 'deleting') EXECUTE FUNCTION refuse_agent_sandbox_delete();
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
             OR (OLD.state = 'queued' AND NEW.state = 'queued' AND NEW.head AND NOT OLD.head)
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

PREVIOUS_GUARD_TRIGGERS = """
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
        AND CASE NEW.state
            WHEN 'leased' THEN NEW.leased_until IS NOT NULL AND NEW.holder IS NOT NULL
                AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
            WHEN 'queued' THEN NEW.leased_until IS NULL AND NEW.holder IS NULL
                AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL
            ELSE NEW.ended_at IS NOT NULL AND NEW.leased_until IS NULL
                AND NEW.end_reason IN ('completed', 'cancelled', 'failed', 'retries_exhausted', 'not_retryable', 'deadline_exceeded', 'continued') END, false))
    EXECUTE FUNCTION guard_agent_run();
CREATE OR REPLACE TRIGGER guard_agent_run_insert BEFORE INSERT ON agent_run FOR EACH ROW
    WHEN (NOT COALESCE(NEW.state = 'queued' AND NEW.lease > interval '0' AND NEW.leased_until IS NULL
                AND NEW.holder IS NULL AND NEW.end_reason IS NULL AND NEW.ended_at IS NULL, false))
    EXECUTE FUNCTION guard_agent_run();
"""

PREVIOUS_EVENT_GUARD = """
CREATE OR REPLACE FUNCTION guard_agent_run_event_insert() RETURNS trigger LANGUAGE plpgsql
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
    wrong record;
BEGIN
    SELECT bool_or(r.id IS NULL OR r.state <> 'leased' OR r.epoch <> a.epoch), bool_or(r.xmin <> mine)
        INTO stale, unheld
        FROM added a LEFT JOIN agent_run r ON r.id = a.run_id;
    IF unheld THEN
        PERFORM 1 FROM agent_run r WHERE r.id IN (SELECT a.run_id FROM added a)
            AND r.xmin <> mine FOR SHARE OF r;
        SELECT bool_or(r.id IS NULL OR r.state <> 'leased' OR r.epoch <> a.epoch) INTO stale
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
    RETURN NULL;
END
$$;
"""


def upgrade() -> None:
    op.execute(GUARD)
    op.execute(GUARD_TRIGGERS)
    op.execute(EVENT_GUARD)
    op.execute(TRUNCATE)
    op.execute(SANDBOX_DELETE)


def downgrade() -> None:
    op.execute("DROP TRIGGER guard_agent_sandbox_delete ON agent_sandbox;")
    op.execute("DROP FUNCTION refuse_agent_sandbox_delete();")
    op.execute("DROP TRIGGER guard_agent_run_event_truncate ON agent_run_event;")
    op.execute("DROP TRIGGER guard_agent_run_truncate ON agent_run;")
    op.execute("DROP FUNCTION refuse_agent_run_truncate();")
    op.execute(PREVIOUS_EVENT_GUARD)
    op.execute(PREVIOUS_GUARD_TRIGGERS)
    op.execute(PREVIOUS_GUARD)
