"""The claim at scale: head runs, workspace lanes in claim order, and a ledger (ADRs/0017).

Revision ID: 0005_claim_lanes
Revises: 0004_fence_guards

A subject's head is now a flag on its run (``head``): the subject's leased run, or else its
first queued run. ``uq_agent_run_head`` allows one head per (workspace, subject), and a leased
run must be its subject's head (``ck_agent_run_head``), so one lease per subject and subject FIFO
hold whoever writes. A new run becomes head under the subject's advisory lock when its subject
has none (``agent_run_enqueued``); a head that ends hands the subject to its next waiting run
under the same lock (``agent_run_moved``). ``agent_subject`` is gone.

Each ``agent_workspace`` row is the workspace's lane: its leased runs and the first offered head
of each band, indexed in claim order per band (``ix_agent_workspace_b0..b2`` on leased, due,
seq), so a claim reads about ``limit`` lanes whatever the number of workspaces. Every change a
lane must hear of (a lease taken or given back, an end, a take-back, a new head) is written to
``agent_workspace_delta`` and folded into the lanes by the next claim, so nothing but a claim
ever locks a lane row, and a single-tenant host never queues its ends on one hot row.
``agent_claim`` is the claim: fold, then rank the first lanes' heads exactly as the domain's
``claim_order`` does, then lease them with ``SKIP LOCKED``.

The lease's expiry is no longer indexed, so a renewal (only ``leased_until`` changes) is a HOT
update; the reaper finds expired leases through ``ix_agent_run_leased``.
"""

from __future__ import annotations

from alembic import op

revision = "0005_claim_lanes"
down_revision = "0004_fence_guards"
branch_labels = None
depends_on = None

HEADS = """
DROP TRIGGER agent_run_bookkeeping ON agent_run;
DROP FUNCTION agent_run_bookkeeping();

ALTER TABLE agent_run ADD COLUMN head boolean NOT NULL DEFAULT false;
-- When the current epoch's claim took the run (its queue wait is claimed_at - due_at).
ALTER TABLE agent_run ADD COLUMN claimed_at timestamptz;
-- How many events the run has: the next event's seq, kept by the write that holds the run's row
-- (a step boundary's renewal), so no append looks for the highest seq among the events.
ALTER TABLE agent_run ADD COLUMN events integer NOT NULL DEFAULT 0;
ALTER TABLE agent_run SET (fillfactor = 80);
-- Filling the new column moves no run: the state guard (which knows no heads yet) stands aside.
ALTER TABLE agent_run DISABLE TRIGGER guard_agent_run;
UPDATE agent_run r SET events = e.events
    FROM (SELECT run_id, max(seq) AS events FROM agent_run_event GROUP BY run_id) e
    WHERE r.id = e.run_id;
UPDATE agent_run SET head = true WHERE state = 'leased';
UPDATE agent_run r SET head = true
    FROM (SELECT DISTINCT ON (q.workspace, q.subject) q.id
          FROM agent_run q
          WHERE q.state = 'queued' AND NOT EXISTS (
              SELECT 1 FROM agent_run l
              WHERE l.workspace = q.workspace AND l.subject = q.subject AND l.state = 'leased')
          ORDER BY q.workspace, q.subject, q.seq) h
    WHERE r.id = h.id;
ALTER TABLE agent_run ENABLE TRIGGER guard_agent_run;
ALTER TABLE agent_run ADD CONSTRAINT ck_agent_run_head
    CHECK ((state <> 'leased' OR head) AND (state <> 'ended' OR NOT head));

DROP TABLE agent_subject;
DROP INDEX uq_agent_run_leased_subject;
DROP INDEX ix_agent_run_queued_subject;
DROP INDEX ix_agent_run_leased_workspace;
DROP INDEX ix_agent_run_lease_expiry;
CREATE UNIQUE INDEX uq_agent_run_head ON agent_run (workspace, subject) WHERE head;
CREATE INDEX ix_agent_run_offered ON agent_run (workspace, band, due_at, seq)
    WHERE state = 'queued' AND head;
CREATE INDEX ix_agent_run_waiting ON agent_run (workspace, subject, seq)
    WHERE state = 'queued' AND NOT head;
CREATE INDEX ix_agent_run_leased ON agent_run (seq) WHERE state = 'leased';
"""

LANES = """
ALTER TABLE agent_workspace
    ADD COLUMN leased integer NOT NULL DEFAULT 0,
    ADD COLUMN h0_due timestamptz, ADD COLUMN h0_seq bigint,
    ADD COLUMN h1_due timestamptz, ADD COLUMN h1_seq bigint,
    ADD COLUMN h2_due timestamptz, ADD COLUMN h2_seq bigint,
    ADD CONSTRAINT ck_agent_workspace_leased CHECK (leased >= 0);
ALTER TABLE agent_workspace SET (fillfactor = 50);
CREATE INDEX ix_agent_workspace_b0 ON agent_workspace (leased, h0_due, h0_seq)
    WHERE active AND h0_due IS NOT NULL;
CREATE INDEX ix_agent_workspace_b1 ON agent_workspace (leased, h1_due, h1_seq)
    WHERE active AND h1_due IS NOT NULL;
CREATE INDEX ix_agent_workspace_b2 ON agent_workspace (leased, h2_due, h2_seq)
    WHERE active AND h2_due IS NOT NULL;

-- A change a lane has yet to hear of: leased runs more or fewer, and the bands (1, 2, 4 for
-- interactive, batch, background) whose first offered head may have moved.
CREATE TABLE agent_workspace_delta (
    id bigserial PRIMARY KEY,
    workspace text NOT NULL,
    leased integer NOT NULL DEFAULT 0,
    bands smallint NOT NULL DEFAULT 0
);

INSERT INTO agent_workspace (id) SELECT DISTINCT workspace FROM agent_run ON CONFLICT DO NOTHING;
INSERT INTO agent_workspace_delta (workspace, bands) SELECT id, 7 FROM agent_workspace;
"""


# The lanes made exact: each pending delta is applied to a lane this claimer can lock (SKIP
# LOCKED: a lane another claimer is folding is left to it), and the first offered head of each
# band a delta names is looked up again (one index probe per band).
#
# ``locked`` is materialised: every lane is locked (or skipped) once, before any delta is taken,
# so a fold never takes some of a lane's deltas (those seen after another folder let go) and not
# the others. The new count adds the deltas to the count read under that lock (the lane's newest
# version, which nobody else can change until this transaction ends), never to the version the
# statement's snapshot saw: another folder may have committed a newer one in between. The claim
# (below) runs the same statement inline.
FOLD = """
CREATE FUNCTION agent_lane_fold() RETURNS void LANGUAGE sql AS $$

    WITH locked AS MATERIALIZED (
        SELECT l.id, l.leased
        FROM (SELECT DISTINCT workspace FROM agent_workspace_delta) p
        CROSS JOIN LATERAL (
            SELECT w.id, w.leased FROM agent_workspace w WHERE w.id = p.workspace
            FOR NO KEY UPDATE SKIP LOCKED) l
    ),
    taken AS (
        DELETE FROM agent_workspace_delta d USING locked l WHERE d.workspace = l.id
        RETURNING d.workspace, d.leased, d.bands
    ),
    summed AS (
        SELECT t.workspace, l.leased + sum(t.leased) AS leased, bit_or(t.bands) AS bands,
               sum(t.leased) AS k
        FROM taken t JOIN locked l ON l.id = t.workspace GROUP BY t.workspace, l.leased
    )
    UPDATE agent_workspace w SET leased = s.leased,
        h0_due = CASE WHEN s.bands & 1 <> 0 THEN b0.due_at ELSE w.h0_due END,
        h0_seq = CASE WHEN s.bands & 1 <> 0 THEN b0.seq ELSE w.h0_seq END,
        h1_due = CASE WHEN s.bands & 2 <> 0 THEN b1.due_at ELSE w.h1_due END,
        h1_seq = CASE WHEN s.bands & 2 <> 0 THEN b1.seq ELSE w.h1_seq END,
        h2_due = CASE WHEN s.bands & 4 <> 0 THEN b2.due_at ELSE w.h2_due END,
        h2_seq = CASE WHEN s.bands & 4 <> 0 THEN b2.seq ELSE w.h2_seq END
    FROM summed s
    LEFT JOIN LATERAL (
        SELECT h.due_at, h.seq FROM agent_run h
        WHERE s.bands & 1 <> 0 AND h.workspace = s.workspace AND h.band = 0
          AND h.state = 'queued' AND h.head
        ORDER BY h.due_at, h.seq LIMIT 1) b0 ON true
    LEFT JOIN LATERAL (
        SELECT h.due_at, h.seq FROM agent_run h
        WHERE s.bands & 2 <> 0 AND h.workspace = s.workspace AND h.band = 1
          AND h.state = 'queued' AND h.head
        ORDER BY h.due_at, h.seq LIMIT 1) b1 ON true
    LEFT JOIN LATERAL (
        SELECT h.due_at, h.seq FROM agent_run h
        WHERE s.bands & 4 <> 0 AND h.workspace = s.workspace AND h.band = 2
          AND h.state = 'queued' AND h.head
        ORDER BY h.due_at, h.seq LIMIT 1) b2 ON true
    WHERE w.id = s.workspace AND w.id = ANY (ARRAY(SELECT workspace FROM summed))
      AND (s.k <> 0 OR s.bands <> 0)
$$;
"""

# A new run is its subject's head when the subject has none; the subject's advisory lock orders
# it against a head that ends at the same time (see agent_run_moved).
ENQUEUED = """
CREATE FUNCTION agent_subject_lock(workspace text, subject text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(hashtext('agentruns.subject'),
                                 hashtext(workspace || chr(31) || subject))
$$;

CREATE FUNCTION agent_run_enqueued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agent_subject_lock(NEW.workspace, NEW.subject);
    NEW.head := NOT EXISTS (
        SELECT 1 FROM agent_run r
        WHERE r.workspace = NEW.workspace AND r.subject = NEW.subject AND r.head);
    RETURN NEW;
END
$$;
CREATE TRIGGER agent_run_enqueued BEFORE INSERT ON agent_run
    FOR EACH ROW EXECUTE FUNCTION agent_run_enqueued();

-- Once per inserting statement: the workspaces' rows, the new heads' lanes, the wake-up.
CREATE FUNCTION agent_run_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agent_workspace (id) SELECT DISTINCT workspace FROM inserted
        ON CONFLICT DO NOTHING;
    INSERT INTO agent_workspace_delta (workspace, bands)
        SELECT workspace, bit_or(1 << band)::smallint FROM inserted WHERE head
        GROUP BY workspace;
    PERFORM pg_notify('agent_run', w.workspace)
        FROM (SELECT DISTINCT workspace FROM inserted) w;
    RETURN NULL;
END
$$;
CREATE TRIGGER agent_run_inserted AFTER INSERT ON agent_run REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION agent_run_inserted();
"""

# Once per updating statement, set-based: every lease taken or given back, and every head that
# left its subject (ended, cancelled, taken back for good), reach their lanes through the ledger,
# whoever writes (a renewal changes neither and writes nothing). A subject whose head left goes
# to its first waiting run, under the subject's lock: an enqueue of the subject either committed
# before (and its run is found here) or runs after (and finds this new head, or none).
MOVED = """
CREATE FUNCTION agent_run_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;  -- the promotions below: their lanes are told already
    END IF;
    -- A claim takes a head out of its band and a lease; a lease given back to the queue offers
    -- its run again; a queued head that ended leaves its band; an ended lease is one fewer.
    INSERT INTO agent_workspace_delta (workspace, leased, bands)
        SELECT n.workspace,
               sum(CASE WHEN (o.state = 'leased') = (n.state = 'leased') THEN 0
                        WHEN n.state = 'leased' THEN 1 ELSE -1 END),
               bit_or(CASE WHEN o.state = 'queued' OR n.state = 'queued'
                           THEN 1 << n.band ELSE 0 END)::smallint
        FROM old_runs o JOIN new_runs n USING (id)
        WHERE (o.state = 'leased') <> (n.state = 'leased') OR (o.head AND NOT n.head)
        GROUP BY n.workspace;
    IF NOT EXISTS (SELECT 1 FROM old_runs o JOIN new_runs n USING (id)
                   WHERE o.head AND NOT n.head) THEN
        RETURN NULL;
    END IF;
    PERFORM agent_subject_lock(s.workspace, s.subject)
        FROM (SELECT DISTINCT n.workspace, n.subject
              FROM old_runs o JOIN new_runs n USING (id)
              WHERE o.head AND NOT n.head ORDER BY 1, 2) s;
    WITH promoted AS (
        UPDATE agent_run r SET head = true
        WHERE r.id = ANY (ARRAY(SELECT nx.id
          FROM (SELECT DISTINCT n.workspace, n.subject
                FROM old_runs o JOIN new_runs n USING (id) WHERE o.head AND NOT n.head) s
          CROSS JOIN LATERAL (
              SELECT w.id FROM agent_run w
              WHERE w.workspace = s.workspace AND w.subject = s.subject
                AND w.state = 'queued' AND NOT w.head
              ORDER BY w.seq LIMIT 1) nx
          WHERE NOT EXISTS (SELECT 1 FROM agent_run h
                            WHERE h.workspace = s.workspace AND h.subject = s.subject
                              AND h.head)))
        RETURNING r.workspace, r.band
    )
    INSERT INTO agent_workspace_delta (workspace, bands)
        SELECT workspace, bit_or(1 << band)::smallint FROM promoted GROUP BY workspace;
    RETURN NULL;
END
$$;
CREATE TRIGGER agent_run_moved AFTER UPDATE ON agent_run
    REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs
    FOR EACH STATEMENT EXECUTE FUNCTION agent_run_moved();
"""

PROMOTE = """
-- A writer that ends a head without saying so still leaves the subject to its next run.
CREATE FUNCTION agent_run_unhead() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.head := false;
    RETURN NEW;
END
$$;
CREATE TRIGGER agent_run_unhead BEFORE UPDATE ON agent_run
    FOR EACH ROW WHEN (NEW.state = 'ended' AND NEW.head) EXECUTE FUNCTION agent_run_unhead();

-- A requeue or a take-back gives a run back to the queue: wake the claimers.
CREATE FUNCTION agent_run_requeued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('agent_run', NEW.workspace);
    RETURN NULL;
END
$$;
CREATE TRIGGER agent_run_requeued AFTER UPDATE ON agent_run
    FOR EACH ROW WHEN (OLD.state = 'leased' AND NEW.state = 'queued')
    EXECUTE FUNCTION agent_run_requeued();
"""

CLAIM = """
CREATE TYPE agent_claim_candidate AS (id uuid, eb integer, load bigint);

-- The claim (ADRs/0017). Fold the ledger into the lanes this claimer can lock; then rank the
-- first p_pool subject heads in claim order: the lanes give, per band, the workspaces in order
-- of (leased, first head), and the first p_pool distinct workspaces hold every head the first
-- p_pool claims can take; their heads are ranked as the domain's claim_order ranks them (load =
-- leased + heads of the same workspace before it). When a workspace's heads fetched for ranking
-- ran out inside the pool (candidates NULL), fetch more and rank again. Lease the first p_limit
-- that no other claimer holds (SKIP LOCKED); when others held some, rank a wider pool for the
-- rest. The leases taken reach their lanes through the ledger, folded by the next claim.
CREATE FUNCTION agent_claim(
    p_now timestamptz, p_aging interval, p_holder text, p_limit integer
) RETURNS TABLE (
    id uuid, kind text, workspace text, subject text, band smallint, payload jsonb, state text,
    epoch integer, attempt integer, seq bigint, enqueued_at timestamptz, due_at timestamptz,
    lease interval, deadline_at timestamptz, leased_until timestamptz, holder text,
    end_reason text, ended_at timestamptz, continues uuid, domain_row boolean,
    trace_context jsonb, last_error_type text, last_error text, last_failure_class text,
    claimed_at timestamptz, claim_band integer, claim_load bigint
) LANGUAGE plpgsql
-- Every read here goes through an index: a sequential scan of the lanes or the runs would make
-- the claim's cost grow with them, whatever the planner thinks of a generic plan's row counts.
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    now_ timestamptz := COALESCE(p_now, now());
    pool integer := p_limit;
    scale integer;
    candidates agent_claim_candidate[];
    n_lanes integer;
    ids uuid[] := '{}';
    bands integer[] := '{}';
    loads bigint[] := '{}';
    more uuid[];
    more_bands integer[];
    more_loads bigint[];
BEGIN
    IF p_limit < 1 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM agent_workspace_delta) THEN

    WITH locked AS MATERIALIZED (
        SELECT l.id, l.leased
        FROM (SELECT DISTINCT workspace FROM agent_workspace_delta) p
        CROSS JOIN LATERAL (
            SELECT w.id, w.leased FROM agent_workspace w WHERE w.id = p.workspace
            FOR NO KEY UPDATE SKIP LOCKED) l
    ),
    taken AS (
        DELETE FROM agent_workspace_delta d USING locked l WHERE d.workspace = l.id
        RETURNING d.workspace, d.leased, d.bands
    ),
    summed AS (
        SELECT t.workspace, l.leased + sum(t.leased) AS leased, bit_or(t.bands) AS bands,
               sum(t.leased) AS k
        FROM taken t JOIN locked l ON l.id = t.workspace GROUP BY t.workspace, l.leased
    )
    UPDATE agent_workspace w SET leased = s.leased,
        h0_due = CASE WHEN s.bands & 1 <> 0 THEN b0.due_at ELSE w.h0_due END,
        h0_seq = CASE WHEN s.bands & 1 <> 0 THEN b0.seq ELSE w.h0_seq END,
        h1_due = CASE WHEN s.bands & 2 <> 0 THEN b1.due_at ELSE w.h1_due END,
        h1_seq = CASE WHEN s.bands & 2 <> 0 THEN b1.seq ELSE w.h1_seq END,
        h2_due = CASE WHEN s.bands & 4 <> 0 THEN b2.due_at ELSE w.h2_due END,
        h2_seq = CASE WHEN s.bands & 4 <> 0 THEN b2.seq ELSE w.h2_seq END
    FROM summed s
    LEFT JOIN LATERAL (
        SELECT h.due_at, h.seq FROM agent_run h
        WHERE s.bands & 1 <> 0 AND h.workspace = s.workspace AND h.band = 0
          AND h.state = 'queued' AND h.head
        ORDER BY h.due_at, h.seq LIMIT 1) b0 ON true
    LEFT JOIN LATERAL (
        SELECT h.due_at, h.seq FROM agent_run h
        WHERE s.bands & 2 <> 0 AND h.workspace = s.workspace AND h.band = 1
          AND h.state = 'queued' AND h.head
        ORDER BY h.due_at, h.seq LIMIT 1) b1 ON true
    LEFT JOIN LATERAL (
        SELECT h.due_at, h.seq FROM agent_run h
        WHERE s.bands & 4 <> 0 AND h.workspace = s.workspace AND h.band = 2
          AND h.state = 'queued' AND h.head
        ORDER BY h.due_at, h.seq LIMIT 1) b2 ON true
    WHERE w.id = s.workspace AND w.id = ANY (ARRAY(SELECT workspace FROM summed))
      AND (s.k <> 0 OR s.bands <> 0);
    END IF;
    LOOP
        scale := 1;
        LOOP
            WITH held AS MATERIALIZED (
                SELECT h.workspace FROM agent_budget_hold h WHERE h.until > now_
            ),
            lanes AS (
                (SELECT w.id, w.leased, 0 AS eb, w.h0_due AS due, w.h0_seq AS seq
                 FROM agent_workspace w
                 WHERE w.active AND w.h0_due IS NOT NULL AND w.h0_due <= now_
                   AND w.id NOT IN (SELECT workspace FROM held)
                 ORDER BY w.leased, w.h0_due, w.h0_seq LIMIT pool)
                UNION ALL
                (SELECT w.id, w.leased, 1, w.h1_due, w.h1_seq FROM agent_workspace w
                 WHERE w.active AND w.h1_due IS NOT NULL AND w.h1_due <= now_
                   AND w.id NOT IN (SELECT workspace FROM held)
                 ORDER BY w.leased, w.h1_due, w.h1_seq LIMIT pool)
                UNION ALL
                (SELECT w.id, w.leased, 1, w.h2_due, w.h2_seq FROM agent_workspace w
                 WHERE w.active AND w.h2_due IS NOT NULL AND p_aging > interval '0'
                   AND w.h2_due <= now_ - p_aging AND w.id NOT IN (SELECT workspace FROM held)
                 ORDER BY w.leased, w.h2_due, w.h2_seq LIMIT pool)
                UNION ALL
                (SELECT w.id, w.leased, 2, w.h2_due, w.h2_seq FROM agent_workspace w
                 WHERE w.active AND w.h2_due IS NOT NULL AND w.h2_due <= now_
                   AND w.h2_due > CASE WHEN p_aging > interval '0' THEN now_ - p_aging
                                       ELSE '-infinity'::timestamptz END
                   AND w.id NOT IN (SELECT workspace FROM held)
                 ORDER BY w.leased, w.h2_due, w.h2_seq LIMIT pool)
            ),
            ranked_lanes AS (
                SELECT id, leased FROM (
                    SELECT DISTINCT ON (id) id, leased, eb, due, seq FROM lanes
                    ORDER BY id, eb, due, seq
                ) firsts
                ORDER BY eb, leased, due, seq LIMIT pool
            ),
            -- A lane whose deltas another claimer is folding right now may be behind: its
            -- heads are ranked too (with the count it has), so a claim never misses work
            -- because of a busy lane.
            behind AS (
                SELECT d.workspace AS id, w.leased + d.k AS leased
                FROM (SELECT workspace, sum(leased) AS k FROM agent_workspace_delta
                      GROUP BY workspace) d
                CROSS JOIN LATERAL (
                    SELECT w.leased FROM agent_workspace w
                    WHERE w.id = d.workspace AND w.active) w
                WHERE d.workspace NOT IN (SELECT workspace FROM held)
            ),
            chosen AS MATERIALIZED (
                SELECT id, leased FROM ranked_lanes WHERE id NOT IN (SELECT id FROM behind)
                UNION ALL
                SELECT id, greatest(leased, 0) FROM behind
            ),
            quota AS (
                SELECT ((pool + greatest(count(*), 1) - 1) / greatest(count(*), 1) * scale + 1)
                    ::integer AS m
                FROM chosen
            ),
            heads AS (
                SELECT c.id AS workspace, c.leased, h.id, h.band, h.due_at, h.seq, h.n, q.m
                FROM chosen c CROSS JOIN quota q
                CROSS JOIN (VALUES (0::smallint), (1::smallint), (2::smallint)) b (band)
                CROSS JOIN LATERAL (
                    SELECT r.id, r.band, r.due_at, r.seq,
                           row_number() OVER (ORDER BY r.due_at, r.seq) AS n
                    FROM agent_run r
                    WHERE r.workspace = c.id AND r.band = b.band AND r.state = 'queued' AND r.head
                      AND r.due_at <= now_
                    ORDER BY r.due_at, r.seq LIMIT q.m) h
            ),
            keyed AS (
                SELECT *, CASE WHEN band = 2 AND p_aging > interval '0' AND due_at <= now_ - p_aging
                               THEN 1 ELSE band END AS eb
                FROM heads
            ),
            ranked AS (
                SELECT *, leased
                          + row_number() OVER (PARTITION BY workspace ORDER BY eb, due_at, seq)
                          - 1
                    AS load
                FROM keyed
            ),
            top AS MATERIALIZED (SELECT * FROM ranked ORDER BY eb, load, due_at, seq LIMIT pool)
            SELECT CASE WHEN EXISTS (SELECT 1 FROM top WHERE n = m) THEN NULL
                        ELSE COALESCE(array_agg(ROW(id, eb, load)::agent_claim_candidate
                                                ORDER BY eb, load, due_at, seq), '{}') END,
                   (SELECT count(*) FROM ranked_lanes)::integer
            INTO candidates, n_lanes
            FROM top;
            EXIT WHEN candidates IS NOT NULL;
            scale := scale * 4;
        END LOOP;
        WITH c AS (
            SELECT * FROM unnest(candidates) WITH ORDINALITY AS c (id, eb, load, ord)
        ),
        picked AS (
            SELECT r.id, c.eb, c.load, c.ord
            FROM c CROSS JOIN LATERAL (
                SELECT r.id FROM agent_run r
                WHERE r.id = c.id AND r.state = 'queued' AND r.head AND r.id <> ALL (ids)
                FOR UPDATE SKIP LOCKED) r
            ORDER BY c.ord LIMIT p_limit - cardinality(ids)
        ),
        claimed AS (
            UPDATE agent_run r SET state = 'leased', epoch = r.epoch + 1,
                leased_until = now_ + r.lease, holder = p_holder, claimed_at = now_
            FROM picked WHERE r.id = picked.id AND r.id = ANY (ARRAY(SELECT id FROM picked))
            RETURNING r.id, picked.eb, picked.load, picked.ord
        )
        SELECT COALESCE(array_agg(claimed.id ORDER BY ord), '{}'),
               COALESCE(array_agg(claimed.eb ORDER BY ord), '{}'),
               COALESCE(array_agg(claimed.load ORDER BY ord), '{}')
        INTO more, more_bands, more_loads FROM claimed;
        ids := ids || more;
        bands := bands || more_bands;
        loads := loads || more_loads;
        -- Done when the batch is full, or every lane and every candidate was seen.
        EXIT WHEN cardinality(ids) >= p_limit
            OR (cardinality(candidates) < pool AND n_lanes < pool) OR pool >= 4096;
        pool := pool * 4;
    END LOOP;
    RETURN QUERY
        SELECT r.id, r.kind, r.workspace, r.subject, r.band, r.payload, r.state, r.epoch,
               r.attempt, r.seq, r.enqueued_at, r.due_at, r.lease, r.deadline_at,
               r.leased_until, r.holder, r.end_reason, r.ended_at, r.continues, r.domain_row,
               r.trace_context, r.last_error_type, r.last_error, r.last_failure_class,
               r.claimed_at, x.eb, x.load
        FROM unnest(ids, bands, loads) WITH ORDINALITY AS x (id, eb, load, ord)
        CROSS JOIN LATERAL (SELECT * FROM agent_run r WHERE r.id = x.id) r
        ORDER BY x.ord;
END
$$;
"""


# 0004's guard, plus the one same-state move a queued run makes: becoming its subject's head.
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


# Events without the foreign key to their run: its check locked the run row for every event
# (about a tenth of a step boundary's cost). 0004's event guard already reads each new event's run
# to fence it; it now also refuses an event whose run does not exist, and a deleted run's events
# go with it through a trigger, as the key's cascade took them.
EVENTS = """
ALTER TABLE agent_run_event DROP CONSTRAINT agent_run_event_run_id_fkey;
CREATE OR REPLACE FUNCTION guard_agent_run_event_insert() RETURNS trigger LANGUAGE plpgsql AS $$
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


CREATE FUNCTION agent_run_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM agent_run_event e WHERE e.run_id IN (SELECT g.id FROM gone_runs g);
    RETURN NULL;
END
$$;
CREATE TRIGGER agent_run_gone AFTER DELETE ON agent_run REFERENCING OLD TABLE AS gone_runs
    FOR EACH STATEMENT EXECUTE FUNCTION agent_run_gone();
"""


DROP_NEW = """
DROP TRIGGER agent_run_gone ON agent_run;
DROP FUNCTION agent_run_gone();
ALTER TABLE agent_run_event ADD CONSTRAINT agent_run_event_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES agent_run (id) ON DELETE CASCADE;
DROP FUNCTION agent_claim(timestamptz, interval, text, integer);
DROP TYPE agent_claim_candidate;
DROP TRIGGER agent_run_requeued ON agent_run;
DROP FUNCTION agent_run_requeued();
DROP TRIGGER agent_run_unhead ON agent_run;
DROP FUNCTION agent_run_unhead();
DROP TRIGGER agent_run_moved ON agent_run;
DROP FUNCTION agent_run_moved();
DROP TRIGGER agent_run_inserted ON agent_run;
DROP FUNCTION agent_run_inserted();
DROP TRIGGER agent_run_enqueued ON agent_run;
DROP FUNCTION agent_run_enqueued();
DROP FUNCTION agent_subject_lock(text, text);
DROP FUNCTION agent_lane_fold();
DROP TABLE agent_workspace_delta;
DROP INDEX ix_agent_workspace_b0;
DROP INDEX ix_agent_workspace_b1;
DROP INDEX ix_agent_workspace_b2;
ALTER TABLE agent_workspace DROP CONSTRAINT ck_agent_workspace_leased,
    DROP COLUMN leased, DROP COLUMN h0_due, DROP COLUMN h0_seq, DROP COLUMN h1_due,
    DROP COLUMN h1_seq, DROP COLUMN h2_due, DROP COLUMN h2_seq;
ALTER TABLE agent_workspace RESET (fillfactor);

DROP INDEX uq_agent_run_head;
DROP INDEX ix_agent_run_offered;
DROP INDEX ix_agent_run_waiting;
DROP INDEX ix_agent_run_leased;
ALTER TABLE agent_run DROP CONSTRAINT ck_agent_run_head, DROP COLUMN head,
    DROP COLUMN claimed_at, DROP COLUMN events;
ALTER TABLE agent_run RESET (fillfactor);
CREATE UNIQUE INDEX uq_agent_run_leased_subject ON agent_run (workspace, subject)
    WHERE state = 'leased';
CREATE INDEX ix_agent_run_queued_subject ON agent_run (workspace, subject, seq)
    WHERE state = 'queued';
CREATE INDEX ix_agent_run_leased_workspace ON agent_run (workspace) WHERE state = 'leased';
CREATE INDEX ix_agent_run_lease_expiry ON agent_run (leased_until) WHERE state = 'leased';
"""


# What a downgrade restores: 0004's guard and event guard, and 0003's subject table (filled from
# the runs) with its bookkeeping trigger.
FENCED_GUARD = """
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

FENCED_EVENTS = """\
CREATE OR REPLACE FUNCTION guard_agent_run_event_insert() RETURNS trigger LANGUAGE plpgsql AS $$
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

"""

SUBJECTS = """

CREATE TABLE agent_subject (
    workspace text NOT NULL,
    subject text NOT NULL,
    head_run uuid,
    head_kind text,
    head_band smallint,
    head_due_at timestamptz,
    head_seq bigint,
    PRIMARY KEY (workspace, subject)
);
CREATE INDEX ix_agent_subject_offered ON agent_subject
    (workspace, head_band, head_due_at, head_seq) WHERE head_run IS NOT NULL;

INSERT INTO agent_subject (workspace, subject)
    SELECT DISTINCT workspace, subject FROM agent_run WHERE state <> 'ended';
UPDATE agent_subject s SET head_run = h.id, head_kind = h.kind, head_band = h.band,
        head_due_at = h.due_at, head_seq = h.seq
    FROM (SELECT DISTINCT ON (r.workspace, r.subject) r.workspace, r.subject, r.id, r.kind,
                 r.band, r.due_at, r.seq
          FROM agent_run r
          WHERE r.state = 'queued' AND NOT EXISTS (
              SELECT 1 FROM agent_run l
              WHERE l.workspace = r.workspace AND l.subject = r.subject AND l.state = 'leased')
          ORDER BY r.workspace, r.subject, r.seq) h
    WHERE s.workspace = h.workspace AND s.subject = h.subject;
"""

BOOKKEEPING = """
CREATE OR REPLACE FUNCTION agent_run_bookkeeping() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    run agent_run%ROWTYPE;
    head record;
    head_id uuid := NULL;
BEGIN
    IF TG_OP = 'DELETE' THEN
        run := OLD;
        IF OLD.state = 'ended' THEN
            RETURN NULL;
        END IF;
    ELSE
        run := NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.state = NEW.state AND NEW.state <> 'queued' THEN
        RETURN NULL;  -- a renewal moves no head
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO agent_workspace (id) VALUES (NEW.workspace) ON CONFLICT DO NOTHING;
    END IF;
    PERFORM 1 FROM agent_subject
        WHERE workspace = run.workspace AND subject = run.subject FOR UPDATE;
    IF NOT FOUND THEN  -- the subject's first run
        INSERT INTO agent_subject (workspace, subject) VALUES (run.workspace, run.subject)
            ON CONFLICT DO NOTHING;
        PERFORM 1 FROM agent_subject
            WHERE workspace = run.workspace AND subject = run.subject FOR UPDATE;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.state = 'leased' THEN
        -- A claim: the subject now has a leased run, so it offers no head; nothing to look up.
        UPDATE agent_subject SET head_run = NULL, head_kind = NULL, head_band = NULL,
                head_due_at = NULL, head_seq = NULL
            WHERE workspace = run.workspace AND subject = run.subject AND head_run IS NOT NULL;
        RETURN NULL;
    END IF;
    IF NOT EXISTS (
            SELECT 1 FROM agent_run r
            WHERE r.workspace = run.workspace AND r.subject = run.subject
              AND r.state = 'leased') THEN
        SELECT r.id, r.kind, r.band, r.due_at, r.seq INTO head
            FROM agent_run r
            WHERE r.workspace = run.workspace AND r.subject = run.subject AND r.state = 'queued'
            ORDER BY r.seq LIMIT 1;
        IF FOUND THEN
            head_id := head.id;
        END IF;
    END IF;
    IF head_id IS NULL THEN
        UPDATE agent_subject SET head_run = NULL, head_kind = NULL, head_band = NULL,
                head_due_at = NULL, head_seq = NULL
            WHERE workspace = run.workspace AND subject = run.subject AND head_run IS NOT NULL;
    ELSE
        UPDATE agent_subject SET head_run = head.id, head_kind = head.kind,
                head_band = head.band, head_due_at = head.due_at, head_seq = head.seq
            WHERE workspace = run.workspace AND subject = run.subject
                AND (head_run IS DISTINCT FROM head.id OR head_due_at IS DISTINCT FROM head.due_at
                    OR head_band IS DISTINCT FROM head.band);
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.state = 'queued'
            AND (TG_OP = 'INSERT' OR OLD.state <> 'queued') THEN
        PERFORM pg_notify('agent_run', NEW.workspace);
    END IF;
    RETURN NULL;
END
$$;
"""

BOOKKEEPING_TRIGGER = """
CREATE TRIGGER agent_run_bookkeeping AFTER INSERT OR UPDATE OR DELETE ON agent_run
    FOR EACH ROW EXECUTE FUNCTION agent_run_bookkeeping();
"""


def upgrade() -> None:
    for block in (HEADS, LANES, FOLD, ENQUEUED, MOVED, PROMOTE, GUARD, EVENTS, CLAIM):
        op.execute(block)
    op.execute("SELECT agent_lane_fold()")


def downgrade() -> None:
    for block in (
        DROP_NEW,
        FENCED_GUARD,
        FENCED_EVENTS,
        SUBJECTS,
        BOOKKEEPING,
        BOOKKEEPING_TRIGGER,
    ):
        op.execute(block)
