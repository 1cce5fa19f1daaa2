"""Parked waits: a waiting run is out of the claim's index while it waits (issue 24, ADRs/0029).

Revision ID: 0023_waiting_offered
Revises: 0022_waiting_since

- ``agent_run.parked``: set by a wait's give-back whose end is still to come, cleared by the
  signal's wake-up, by the first claim after the wait's end, and by every claim (a leased run is
  never parked: ``guard_agent_run``).
- ``ix_agent_run_offered`` leaves parked runs out, so the claim's ranking and the lanes' fold
  read nothing of the runs that wait, however many; ``ix_agent_run_parked`` holds them by the
  end of their wait, and ``agent_claim`` first offers again those whose end has passed (one probe
  when none has). ``agent_lane_fold`` and the claim's copy of it look up unparked heads only.
- ``guard_agent_run`` (function and condition) allows one more queued -> queued write: a parked
  run offered again (``parked`` cleared, its head and wait's end kept), and refuses a parked
  leased run.

Runs that wait when this revision runs stay unparked: they are offered at their wait's end as
before (their claim resolves the wait), only not kept out of the index. The index is built again
under the table's SHARE lock (writes wait while it builds).
"""

from __future__ import annotations

from alembic import op

revision = "0023_waiting_offered"
down_revision = "0022_waiting_since"
branch_labels = None
depends_on = None

PARKED = """
ALTER TABLE agent_run ADD COLUMN parked boolean DEFAULT false NOT NULL;
DROP INDEX ix_agent_run_offered;
CREATE INDEX ix_agent_run_offered ON agent_run (workspace, band, due_at, seq)
    WHERE state = 'queued' AND head AND NOT parked;
CREATE INDEX ix_agent_run_parked ON agent_run (waiting_until) WHERE state = 'queued' AND parked;
"""

PREVIOUS_INDEX = """
DROP INDEX ix_agent_run_parked;
DROP INDEX ix_agent_run_offered;
CREATE INDEX ix_agent_run_offered ON agent_run (workspace, band, due_at, seq)
    WHERE state = 'queued' AND head;
"""

CLAIM = """
CREATE OR REPLACE FUNCTION agent_claim(
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
        SELECT h.due_at, h.seq FROM agent_run h
        WHERE s.bands & 1 <> 0 AND h.workspace = s.workspace AND h.band = 0
          AND h.state = 'queued' AND h.head AND NOT h.parked
        ORDER BY h.due_at, h.seq LIMIT 1) b0 ON true
    LEFT JOIN LATERAL (
        SELECT h.due_at, h.seq FROM agent_run h
        WHERE s.bands & 2 <> 0 AND h.workspace = s.workspace AND h.band = 1
          AND h.state = 'queued' AND h.head AND NOT h.parked
        ORDER BY h.due_at, h.seq LIMIT 1) b1 ON true
    LEFT JOIN LATERAL (
        SELECT h.due_at, h.seq FROM agent_run h
        WHERE s.bands & 4 <> 0 AND h.workspace = s.workspace AND h.band = 2
          AND h.state = 'queued' AND h.head AND NOT h.parked
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
                      AND NOT r.parked AND r.due_at <= now_
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
        SELECT COALESCE(array_agg(p.id ORDER BY p.ord), '{}'),
               COALESCE(array_agg(p.eb ORDER BY p.ord), '{}'),
               COALESCE(array_agg(p.load ORDER BY p.ord), '{}')
        INTO more, more_bands, more_loads
        FROM (
            SELECT r.id, c.eb, c.load, c.ord
            FROM unnest(candidates) WITH ORDINALITY AS c (id, eb, load, ord)
            CROSS JOIN LATERAL (
                SELECT r.id FROM agent_run r
                WHERE r.id = c.id AND r.state = 'queued' AND r.head AND r.id <> ALL (ids)
                FOR UPDATE SKIP LOCKED) r
            ORDER BY c.ord LIMIT p_limit - cardinality(ids)
        ) p;
        UPDATE agent_run r SET state = 'leased', epoch = r.epoch + 1,
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

PREVIOUS_CLAIM = """
CREATE OR REPLACE FUNCTION agent_claim(
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
        SELECT COALESCE(array_agg(p.id ORDER BY p.ord), '{}'),
               COALESCE(array_agg(p.eb ORDER BY p.ord), '{}'),
               COALESCE(array_agg(p.load ORDER BY p.ord), '{}')
        INTO more, more_bands, more_loads
        FROM (
            SELECT r.id, c.eb, c.load, c.ord
            FROM unnest(candidates) WITH ORDINALITY AS c (id, eb, load, ord)
            CROSS JOIN LATERAL (
                SELECT r.id FROM agent_run r
                WHERE r.id = c.id AND r.state = 'queued' AND r.head AND r.id <> ALL (ids)
                FOR UPDATE SKIP LOCKED) r
            ORDER BY c.ord LIMIT p_limit - cardinality(ids)
        ) p;
        UPDATE agent_run r SET state = 'leased', epoch = r.epoch + 1,
            leased_until = now_ + r.lease, holder = p_holder, claimed_at = now_
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

FOLD = """
CREATE OR REPLACE FUNCTION agent_lane_fold() RETURNS void LANGUAGE sql
SET jit = off
SET search_path FROM CURRENT
AS $$

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
          AND h.state = 'queued' AND h.head AND NOT h.parked
        ORDER BY h.due_at, h.seq LIMIT 1) b0 ON true
    LEFT JOIN LATERAL (
        SELECT h.due_at, h.seq FROM agent_run h
        WHERE s.bands & 2 <> 0 AND h.workspace = s.workspace AND h.band = 1
          AND h.state = 'queued' AND h.head AND NOT h.parked
        ORDER BY h.due_at, h.seq LIMIT 1) b1 ON true
    LEFT JOIN LATERAL (
        SELECT h.due_at, h.seq FROM agent_run h
        WHERE s.bands & 4 <> 0 AND h.workspace = s.workspace AND h.band = 2
          AND h.state = 'queued' AND h.head AND NOT h.parked
        ORDER BY h.due_at, h.seq LIMIT 1) b2 ON true
    WHERE w.id = s.workspace AND w.id = ANY (ARRAY(SELECT workspace FROM summed))
      AND (s.k <> 0 OR s.bands <> 0)
$$;
"""

PREVIOUS_FOLD = """
CREATE OR REPLACE FUNCTION agent_lane_fold() RETURNS void LANGUAGE sql
SET jit = off
SET search_path FROM CURRENT
AS $$

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

PREVIOUS_GUARD_TRIGGER = """
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


def upgrade() -> None:
    op.execute(PARKED)
    op.execute(FOLD)
    op.execute(CLAIM)
    op.execute(GUARD)
    op.execute(GUARD_TRIGGER)


def downgrade() -> None:
    op.execute(PREVIOUS_GUARD_TRIGGER)
    op.execute(PREVIOUS_GUARD)
    op.execute(PREVIOUS_CLAIM)
    op.execute(PREVIOUS_FOLD)
    op.execute(PREVIOUS_INDEX)
    op.execute("ALTER TABLE agent_run DROP COLUMN parked;")
