"""Claims that are their own transactions take turns (ADRs/0038).

Revision ID: 0033_claims_take_turns
Revises: 0032_keyed_probes

Concurrent claimers rank the same first heads in claim order. Each found the heads the other had
just locked, ranked a pool four times wider for the rest, and often again: with four claimers in
one process, the claims ranked 3.1 times each and the machine spent twice the CPU per run.
``agent_claim`` gains ``p_alone``: a claim larger than the margin (8) that is its own transaction
(a worker's, sent by the adapter from an autocommitted statement) first waits for any other such
claim of this schema to commit, on a transaction-scoped advisory lock, then ranks what that one
left. A claim inside a longer transaction (a kind with a domain row, whose handler moves the row
in the claim's transaction) passes ``false`` and does not wait, so no caller's transaction can
hold every worker's claim; nor does a claim within the margin, which the margin covers. Callers
of the four-argument form (an operator's query) keep it: the new argument defaults to ``false``.

No data changes. The downgrade puts back 0032's ``agent_claim``.
"""

from __future__ import annotations

from alembic import op

revision = "0033_claims_take_turns"
down_revision = "0032_keyed_probes"
branch_labels = None
depends_on = None

CLAIM = """
DROP FUNCTION agent_claim(timestamptz, interval, text, integer);
CREATE FUNCTION agent_claim(
    p_now timestamptz, p_aging interval, p_holder text, p_limit integer,
    p_alone boolean DEFAULT false
) RETURNS TABLE (
    id uuid, kind text, workspace text, subject text, band smallint, payload jsonb, state text,
    epoch integer, attempt integer, seq bigint, enqueued_at timestamptz, due_at timestamptz,
    lease interval, deadline_at timestamptz, leased_until timestamptz, holder text,
    end_reason text, ended_at timestamptz, continues uuid, domain_row boolean,
    trace_context jsonb, last_error_type text, last_error text, last_failure_class text,
    claimed_at timestamptz, claim_band integer, claim_load bigint
) LANGUAGE plpgsql
-- Every read here goes through an index: a sequential scan of the lanes or the runs would make
-- the claim's cost grow with them, whatever the planner thinks of a generic plan's row counts;
-- and statistics taken while the lanes were still empty (after a bulk load, before the first
-- fold) made the lane walk a bitmap scan of every lane and a sort. Before PostgreSQL 18 a
-- disabled node adds 1e10 to a plan's cost, past jit_above_cost: without jit = off every claim
-- JIT-compiled its plan on a packaged server (about 530 ms). The search_path is the migration's,
-- so the names below resolve in agentruns' schema whoever calls (ADRs/0021).
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    now_ timestamptz := COALESCE(p_now, now());
    -- The candidates ranked beyond the limit, for the heads a concurrent claim takes first.
    margin constant integer := 8;
    pool integer := p_limit + margin;
    scale integer;
    candidates agent_claim_candidate[];
    n_lanes integer;
    ids uuid[] := '{}';
    bands integer[] := '{}';
    loads bigint[] := '{}';
    more uuid[];
    more_bands integer[];
    more_loads bigint[];
    promoted boolean;
BEGIN
    -- A wait whose end has passed is offered again first, whatever the limit (a claim of some
    -- kinds calls this with none before its own read): one probe of ix_agent_run_parked when
    -- no wait has ended. The lanes hear of it through the ledger, folded below.
    IF EXISTS (SELECT 1 FROM agent_run p
               WHERE p.state = 'queued' AND p.parked AND p.waiting_until <= now_) THEN
        UPDATE agent_run r SET parked = false
        WHERE r.id = ANY (ARRAY(
            SELECT p.id FROM agent_run p
            WHERE p.state = 'queued' AND p.parked AND p.waiting_until <= now_
            ORDER BY p.waiting_until LIMIT 1000
            FOR UPDATE SKIP LOCKED))
          AND r.state = 'queued' AND r.parked;
    END IF;
    IF p_limit < 1 THEN
        RETURN;
    END IF;
    -- A claim that is its own transaction (p_alone: a worker's) and larger than the margin
    -- waits for such a claim of this schema that is under way to commit, then ranks what that
    -- one left (ADRs/0038). Concurrent claimers rank the same first heads: each found the
    -- other's locked, ranked a pool four times wider, and again. Later statements take their
    -- own snapshots and see its leases. A claim within the margin goes ahead: the margin covers
    -- what it takes, and small claims in turns would be served one after another (eight
    -- claimers of one run each drained 21% slower). A claim inside a longer transaction does
    -- not wait: the lock is held until commit, and another caller's transaction must never
    -- hold every worker's claim.
    IF p_alone AND p_limit > margin THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(
            pg_catalog.hashtext('agentruns.claim'), 'agent_run'::regclass::oid::integer);
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
        SELECT x.due_at, x.seq FROM (
            (SELECT h.due_at, h.seq FROM agent_run h
             WHERE s.bands & 1 <> 0 AND h.workspace = s.workspace AND h.band = 0
               AND h.state = 'queued' AND h.head AND NOT h.parked
             ORDER BY h.due_at, h.seq LIMIT 1)
            UNION ALL
            (SELECT o.due_at, o.seq FROM agent_subject_head o
             WHERE s.bands & 1 <> 0 AND EXISTS (SELECT 1 FROM agent_subject_head)
               AND o.workspace = s.workspace AND o.band = 0
             ORDER BY o.due_at, o.seq LIMIT 1)) x
        ORDER BY x.due_at, x.seq LIMIT 1) b0 ON true
    LEFT JOIN LATERAL (
        SELECT x.due_at, x.seq FROM (
            (SELECT h.due_at, h.seq FROM agent_run h
             WHERE s.bands & 2 <> 0 AND h.workspace = s.workspace AND h.band = 1
               AND h.state = 'queued' AND h.head AND NOT h.parked
             ORDER BY h.due_at, h.seq LIMIT 1)
            UNION ALL
            (SELECT o.due_at, o.seq FROM agent_subject_head o
             WHERE s.bands & 2 <> 0 AND EXISTS (SELECT 1 FROM agent_subject_head)
               AND o.workspace = s.workspace AND o.band = 1
             ORDER BY o.due_at, o.seq LIMIT 1)) x
        ORDER BY x.due_at, x.seq LIMIT 1) b1 ON true
    LEFT JOIN LATERAL (
        SELECT x.due_at, x.seq FROM (
            (SELECT h.due_at, h.seq FROM agent_run h
             WHERE s.bands & 4 <> 0 AND h.workspace = s.workspace AND h.band = 2
               AND h.state = 'queued' AND h.head AND NOT h.parked
             ORDER BY h.due_at, h.seq LIMIT 1)
            UNION ALL
            (SELECT o.due_at, o.seq FROM agent_subject_head o
             WHERE s.bands & 4 <> 0 AND EXISTS (SELECT 1 FROM agent_subject_head)
               AND o.workspace = s.workspace AND o.band = 2
             ORDER BY o.due_at, o.seq LIMIT 1)) x
        ORDER BY x.due_at, x.seq LIMIT 1) b2 ON true
    WHERE w.id = s.workspace AND w.id = ANY (ARRAY(SELECT workspace FROM summed))
      AND (s.k <> 0 OR s.bands <> 0);
    END IF;
    -- Promoted heads are ranked beside the flagged ones; with none, their branch is not run.
    promoted := EXISTS (SELECT 1 FROM agent_subject_head);
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
                    SELECT x.id, x.band, x.due_at, x.seq,
                           row_number() OVER (ORDER BY x.due_at, x.seq) AS n
                    FROM (
                        (SELECT r.id, r.band, r.due_at, r.seq FROM agent_run r
                         WHERE r.workspace = c.id AND r.band = b.band AND r.state = 'queued'
                           AND r.head AND NOT r.parked AND r.due_at <= now_
                         ORDER BY r.due_at, r.seq LIMIT q.m)
                        UNION ALL
                        (SELECT o.run_id, o.band, o.due_at, o.seq FROM agent_subject_head o
                         WHERE promoted AND o.workspace = c.id AND o.band = b.band
                           AND o.due_at <= now_
                         ORDER BY o.due_at, o.seq LIMIT q.m)) x
                    ORDER BY x.due_at, x.seq LIMIT q.m) h
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
        SELECT COALESCE(array_agg(p.id ORDER BY p.ord), '{}'),
               COALESCE(array_agg(p.eb ORDER BY p.ord), '{}'),
               COALESCE(array_agg(p.load ORDER BY p.ord), '{}')
        INTO more, more_bands, more_loads
        FROM (
            SELECT r.id, c.eb, c.load, c.ord
            FROM unnest(candidates) WITH ORDINALITY AS c (id, eb, load, ord)
            -- A promoted head is still one while its subject's row names it: a scalar probe by
            -- the row's key (as an EXISTS, it was planned as a hash of the whole table).
            CROSS JOIN LATERAL (
                SELECT r.id FROM agent_run r
                WHERE r.id = c.id AND r.state = 'queued' AND r.id <> ALL (ids)
                  AND (r.head OR (
                      SELECT o.run_id FROM agent_subject_head o
                      WHERE o.workspace = r.workspace AND o.subject = r.subject) = r.id)
                FOR UPDATE SKIP LOCKED) r
            ORDER BY c.ord LIMIT p_limit - cardinality(ids)
        ) p;
        UPDATE agent_run r SET state = 'leased', epoch = r.epoch + 1, head = true,
            leased_until = now_ + r.lease, holder = p_holder, claimed_at = now_, parked = false
        WHERE r.id = ANY (more);
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

OLD_CLAIM = """
DROP FUNCTION agent_claim(timestamptz, interval, text, integer, boolean);
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
-- the claim's cost grow with them, whatever the planner thinks of a generic plan's row counts;
-- and statistics taken while the lanes were still empty (after a bulk load, before the first
-- fold) made the lane walk a bitmap scan of every lane and a sort. Before PostgreSQL 18 a
-- disabled node adds 1e10 to a plan's cost, past jit_above_cost: without jit = off every claim
-- JIT-compiled its plan on a packaged server (about 530 ms). The search_path is the migration's,
-- so the names below resolve in agentruns' schema whoever calls (ADRs/0021).
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    now_ timestamptz := COALESCE(p_now, now());
    pool integer := p_limit + 8;
    scale integer;
    candidates agent_claim_candidate[];
    n_lanes integer;
    ids uuid[] := '{}';
    bands integer[] := '{}';
    loads bigint[] := '{}';
    more uuid[];
    more_bands integer[];
    more_loads bigint[];
    promoted boolean;
BEGIN
    -- A wait whose end has passed is offered again first, whatever the limit (a claim of some
    -- kinds calls this with none before its own read): one probe of ix_agent_run_parked when
    -- no wait has ended. The lanes hear of it through the ledger, folded below.
    IF EXISTS (SELECT 1 FROM agent_run p
               WHERE p.state = 'queued' AND p.parked AND p.waiting_until <= now_) THEN
        UPDATE agent_run r SET parked = false
        WHERE r.id = ANY (ARRAY(
            SELECT p.id FROM agent_run p
            WHERE p.state = 'queued' AND p.parked AND p.waiting_until <= now_
            ORDER BY p.waiting_until LIMIT 1000
            FOR UPDATE SKIP LOCKED))
          AND r.state = 'queued' AND r.parked;
    END IF;
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
        SELECT x.due_at, x.seq FROM (
            (SELECT h.due_at, h.seq FROM agent_run h
             WHERE s.bands & 1 <> 0 AND h.workspace = s.workspace AND h.band = 0
               AND h.state = 'queued' AND h.head AND NOT h.parked
             ORDER BY h.due_at, h.seq LIMIT 1)
            UNION ALL
            (SELECT o.due_at, o.seq FROM agent_subject_head o
             WHERE s.bands & 1 <> 0 AND EXISTS (SELECT 1 FROM agent_subject_head)
               AND o.workspace = s.workspace AND o.band = 0
             ORDER BY o.due_at, o.seq LIMIT 1)) x
        ORDER BY x.due_at, x.seq LIMIT 1) b0 ON true
    LEFT JOIN LATERAL (
        SELECT x.due_at, x.seq FROM (
            (SELECT h.due_at, h.seq FROM agent_run h
             WHERE s.bands & 2 <> 0 AND h.workspace = s.workspace AND h.band = 1
               AND h.state = 'queued' AND h.head AND NOT h.parked
             ORDER BY h.due_at, h.seq LIMIT 1)
            UNION ALL
            (SELECT o.due_at, o.seq FROM agent_subject_head o
             WHERE s.bands & 2 <> 0 AND EXISTS (SELECT 1 FROM agent_subject_head)
               AND o.workspace = s.workspace AND o.band = 1
             ORDER BY o.due_at, o.seq LIMIT 1)) x
        ORDER BY x.due_at, x.seq LIMIT 1) b1 ON true
    LEFT JOIN LATERAL (
        SELECT x.due_at, x.seq FROM (
            (SELECT h.due_at, h.seq FROM agent_run h
             WHERE s.bands & 4 <> 0 AND h.workspace = s.workspace AND h.band = 2
               AND h.state = 'queued' AND h.head AND NOT h.parked
             ORDER BY h.due_at, h.seq LIMIT 1)
            UNION ALL
            (SELECT o.due_at, o.seq FROM agent_subject_head o
             WHERE s.bands & 4 <> 0 AND EXISTS (SELECT 1 FROM agent_subject_head)
               AND o.workspace = s.workspace AND o.band = 2
             ORDER BY o.due_at, o.seq LIMIT 1)) x
        ORDER BY x.due_at, x.seq LIMIT 1) b2 ON true
    WHERE w.id = s.workspace AND w.id = ANY (ARRAY(SELECT workspace FROM summed))
      AND (s.k <> 0 OR s.bands <> 0);
    END IF;
    -- Promoted heads are ranked beside the flagged ones; with none, their branch is not run.
    promoted := EXISTS (SELECT 1 FROM agent_subject_head);
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
                    SELECT x.id, x.band, x.due_at, x.seq,
                           row_number() OVER (ORDER BY x.due_at, x.seq) AS n
                    FROM (
                        (SELECT r.id, r.band, r.due_at, r.seq FROM agent_run r
                         WHERE r.workspace = c.id AND r.band = b.band AND r.state = 'queued'
                           AND r.head AND NOT r.parked AND r.due_at <= now_
                         ORDER BY r.due_at, r.seq LIMIT q.m)
                        UNION ALL
                        (SELECT o.run_id, o.band, o.due_at, o.seq FROM agent_subject_head o
                         WHERE promoted AND o.workspace = c.id AND o.band = b.band
                           AND o.due_at <= now_
                         ORDER BY o.due_at, o.seq LIMIT q.m)) x
                    ORDER BY x.due_at, x.seq LIMIT q.m) h
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
        SELECT COALESCE(array_agg(p.id ORDER BY p.ord), '{}'),
               COALESCE(array_agg(p.eb ORDER BY p.ord), '{}'),
               COALESCE(array_agg(p.load ORDER BY p.ord), '{}')
        INTO more, more_bands, more_loads
        FROM (
            SELECT r.id, c.eb, c.load, c.ord
            FROM unnest(candidates) WITH ORDINALITY AS c (id, eb, load, ord)
            -- A promoted head is still one while its subject's row names it: a scalar probe by
            -- the row's key (as an EXISTS, it was planned as a hash of the whole table).
            CROSS JOIN LATERAL (
                SELECT r.id FROM agent_run r
                WHERE r.id = c.id AND r.state = 'queued' AND r.id <> ALL (ids)
                  AND (r.head OR (
                      SELECT o.run_id FROM agent_subject_head o
                      WHERE o.workspace = r.workspace AND o.subject = r.subject) = r.id)
                FOR UPDATE SKIP LOCKED) r
            ORDER BY c.ord LIMIT p_limit - cardinality(ids)
        ) p;
        UPDATE agent_run r SET state = 'leased', epoch = r.epoch + 1, head = true,
            leased_until = now_ + r.lease, holder = p_holder, claimed_at = now_, parked = false
        WHERE r.id = ANY (more);
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


def upgrade() -> None:
    op.execute(CLAIM)


def downgrade() -> None:
    op.execute(OLD_CLAIM)
