"""A subject's next run is promoted on a narrow row, not by rewriting the run (ADRs/0036).

Revision ID: 0031_subject_heads
Revises: 0030_run_history

When a subject's head ended, ``agent_run_moved`` promoted its next queued run with ``UPDATE
agent_run SET head = true``: a whole-row update (``head`` is in the predicates of three partial
indexes, so never HOT) that wrote entries into the primary key, ``uq_agent_run_head``,
``ix_agent_run_offered``, ``ix_agent_run_queued_seq`` and ``ix_agent_run_queued_console``. Now the
promotion inserts the subject's row in ``agent_subject_head`` (the run, with its band, due time
and queue order for the claim's order), and the run's own claim, which rewrites the run anyway,
flags it head; the claim statement's trigger (``agent_run_moved``) deletes that row, and refuses
a run flagged head while its subject's row names another. The claim, the lanes' fold and the
enqueue read both kinds of head; a merge's debounce of a promoted head moves its row
(``agent_run_head_postponed``); only agent_run's triggers write the new table
(``guard_agent_subject_head``).

No data moves: every head an earlier revision flagged stays a valid flagged head, and the table
starts empty; the next end of a subject with waiting runs promotes through it. The downgrade
flags each promoted head on its run (the write the promotion used to make; the flag takes the
head, so its row goes), drops the table and the new functions, and writes 0029's functions back.
"""

from __future__ import annotations

from alembic import op

revision = "0031_subject_heads"
down_revision = "0030_run_history"
branch_labels = None
depends_on = None

TABLE = """
CREATE TABLE agent_subject_head (
    workspace text NOT NULL,
    subject text NOT NULL,
    run_id uuid NOT NULL,
    band smallint NOT NULL,
    due_at timestamptz NOT NULL,
    seq bigint NOT NULL,
    CONSTRAINT agent_subject_head_pkey PRIMARY KEY (workspace, subject)
);

-- The promoted heads in the claim's order (never parked: a wait parks a run given back by its
-- lease, flagged head by its claim).
CREATE INDEX ix_agent_subject_head_offered ON agent_subject_head (workspace, band, due_at, seq);
"""

FUNCTIONS = """
-- The lanes made exact: each pending delta is applied to a lane this claimer can lock (SKIP
-- LOCKED: a lane another claimer is folding is left to it), and the first offered head of each
-- band a delta names is looked up again (one probe per band of the flagged heads, and one of the
-- promoted ones if any run is promoted: a test made once per fold, in the fold's snapshot).
-- `locked` is materialised: every lane is locked (or skipped) once, before any delta is taken,
-- so a fold never takes some of a lane's deltas (those seen after another folder let go) and not
-- the others. The new count adds the deltas to the count read under that lock (the lane's newest
-- version, which nobody else can change until this transaction ends), never to the version the
-- statement's snapshot saw: another folder may have committed a newer one in between.
-- agent_claim runs the same statement inline.
CREATE OR REPLACE FUNCTION agent_lane_fold() RETURNS void LANGUAGE sql
SET enable_seqscan = off
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
      AND (s.k <> 0 OR s.bands <> 0)
$$;

CREATE OR REPLACE FUNCTION agent_run_enqueued() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM agent_subject_lock(NEW.workspace, NEW.subject);
    NEW.head := NOT EXISTS (
        SELECT 1 FROM agent_run r
        WHERE r.workspace = NEW.workspace AND r.subject = NEW.subject AND r.head)
        AND NOT EXISTS (
        SELECT 1 FROM agent_run r
        WHERE r.workspace = NEW.workspace AND r.subject = NEW.subject AND r.state = 'queued'
          AND NOT r.head);
    RETURN NEW;
END
$$;

-- Once per updating statement, set-based, without pairing the transition tables' rows (a join
-- of the two is a nested loop, quadratic in the rows one statement moves): a workspace's leased
-- delta is its new leased rows minus its old ones, and the bands to look up again are those of
-- every queued row version, old or new (a renewal adds nothing and writes no row). A subject's
-- next run is promoted when one of its runs ended; the promotion itself checks that the subject
-- has no head left, flagged or named.
CREATE OR REPLACE FUNCTION agent_run_moved() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path FROM CURRENT
AS $$
DECLARE
    wrong uuid;
BEGIN
    -- A claim takes a head out of its band and a lease; a lease given back to the queue offers
    -- its run again; a queued head that ended leaves its band; an ended lease is one fewer.
    INSERT INTO agent_workspace_delta (workspace, leased, bands)
        SELECT m.workspace, sum(m.leased), bit_or(m.bands)::smallint
        FROM (SELECT n.workspace, CASE WHEN n.state = 'leased' THEN 1 ELSE 0 END AS leased,
                     CASE WHEN n.state = 'queued' THEN 1 << n.band ELSE 0 END AS bands
              FROM new_runs n
              UNION ALL
              SELECT o.workspace, CASE WHEN o.state = 'leased' THEN -1 ELSE 0 END,
                     CASE WHEN o.state = 'queued' THEN 1 << o.band ELSE 0 END
              FROM old_runs o) m
        GROUP BY m.workspace
        HAVING sum(m.leased) <> 0 OR bit_or(m.bands) <> 0;
    -- A run that was not head before this statement and is now flagged head (a promoted head's
    -- claim flags it) takes the head its subject's row names, and the row goes; a run that was
    -- not head and ended (a promoted head cancelled before its claim) gives its row up. A run
    -- flagged head that its subject's row does not name would be a second head: the lease of a
    -- run out of FIFO order, refused. Only rows that were not head are looked at, each by its
    -- key: a renewal, or the claim or the end of a flagged head, reads nothing here.
    IF EXISTS (SELECT 1 FROM old_runs o WHERE NOT o.head) THEN
        WITH moved AS MATERIALIZED (
            SELECT r.id, r.head, x.at, x.run_id FROM old_runs o
            CROSS JOIN LATERAL (
                SELECT r.id, r.workspace, r.subject, r.head FROM agent_run r
                WHERE r.id = o.id AND (r.head OR r.state = 'ended') LIMIT 1) r
            LEFT JOIN LATERAL (
                SELECT x.ctid AS at, x.run_id FROM agent_subject_head x
                WHERE x.workspace = r.workspace AND x.subject = r.subject LIMIT 1) x ON true
            WHERE NOT o.head
        ),
        taken AS (
            DELETE FROM agent_subject_head o
            WHERE o.ctid = ANY (ARRAY(SELECT m.at FROM moved m WHERE m.run_id = m.id))
        )
        SELECT m.id INTO wrong FROM moved m
        WHERE m.head AND m.run_id IS DISTINCT FROM m.id LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'agent_run %: only its subject''s head is leased or flagged head (its '
                'leased run, or else its first queued run)', wrong
                USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_head';
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM new_runs n WHERE n.state = 'ended') THEN
        RETURN NULL;
    END IF;
    -- A subject whose run ended goes to its first waiting run if it has no head left, under
    -- the subject's lock: an enqueue of the subject either committed before (and its run is
    -- found here) or runs after (and finds this new head, or none).
    PERFORM agent_subject_lock(s.workspace, s.subject)
        FROM (SELECT DISTINCT n.workspace, n.subject FROM new_runs n WHERE n.state = 'ended'
              ORDER BY 1, 2) s;
    -- The promotion names the next run on the subject's narrow row: the run itself is not
    -- written (its claim flags it head). The promoted head's band is looked up again.
    WITH promoted AS (
        INSERT INTO agent_subject_head (workspace, subject, run_id, band, due_at, seq)
        SELECT s.workspace, s.subject, nx.id, nx.band, nx.due_at, nx.seq
        FROM (SELECT DISTINCT n.workspace, n.subject FROM new_runs n
              WHERE n.state = 'ended') s
        CROSS JOIN LATERAL (
            SELECT w.id, w.band, w.due_at, w.seq FROM agent_run w
            WHERE w.workspace = s.workspace AND w.subject = s.subject
              AND w.state = 'queued' AND NOT w.head
            ORDER BY w.seq LIMIT 1) nx
        WHERE NOT EXISTS (SELECT 1 FROM agent_run h
                          WHERE h.workspace = s.workspace AND h.subject = s.subject
                            AND h.head)
          AND (SELECT o.run_id FROM agent_subject_head o
               WHERE o.workspace = s.workspace AND o.subject = s.subject) IS NULL
        RETURNING workspace, band
    )
    INSERT INTO agent_workspace_delta (workspace, bands)
        SELECT workspace, bit_or(1 << band)::smallint FROM promoted GROUP BY workspace;
    RETURN NULL;
END
$$;

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
            CROSS JOIN LATERAL (
                SELECT r.id FROM agent_run r
                WHERE r.id = c.id AND r.state = 'queued' AND r.id <> ALL (ids)
                  AND (r.head OR EXISTS (
                      SELECT 1 FROM agent_subject_head o
                      WHERE o.workspace = r.workspace AND o.subject = r.subject
                        AND o.run_id = r.id))
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

NEW_OBJECTS = """
-- A promoted head made due later before its claim (a merge's debounce: ADRs/0031) keeps its
-- place in the claim's order: its row moves with it. Called only for a queued run not flagged
-- head whose due time changed.
CREATE FUNCTION agent_run_head_postponed() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE agent_subject_head o SET due_at = NEW.due_at
    WHERE o.workspace = NEW.workspace AND o.subject = NEW.subject AND o.run_id = NEW.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER agent_run_head_postponed AFTER UPDATE OF due_at ON agent_run FOR EACH ROW
    WHEN (NOT OLD.head AND OLD.state = 'queued' AND NEW.state = 'queued'
          AND NEW.due_at IS DISTINCT FROM OLD.due_at)
    EXECUTE FUNCTION agent_run_head_postponed();

-- agent_subject_head is agent_run's bookkeeping: only agent_run's triggers write it (they run at
-- trigger depth 1 or more), so no writer can name another run its subject's head, or take the
-- name away from the one promoted, by writing the table itself; TRUNCATE is refused while it
-- names a head.
CREATE FUNCTION refuse_agent_subject_head_write() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' AND NOT EXISTS (SELECT 1 FROM agent_subject_head) THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'agent_subject_head: a subject''s head is named by agent_run''s triggers '
        'only, not by a % of the table', lower(TG_OP)
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_subject_head';
END
$$;

CREATE TRIGGER guard_agent_subject_head BEFORE INSERT OR UPDATE OR DELETE ON agent_subject_head
    FOR EACH ROW WHEN (pg_trigger_depth() < 1) EXECUTE FUNCTION refuse_agent_subject_head_write();
CREATE TRIGGER guard_agent_subject_head_truncate BEFORE TRUNCATE ON agent_subject_head
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_agent_subject_head_write();
"""

# Each promoted head flagged on its run, as the promotion did before: the flag takes the head
# (agent_run_moved deletes its row), so the table is empty when it goes.
FLAG_PROMOTED = """
UPDATE agent_run SET head = true WHERE id IN (SELECT run_id FROM agent_subject_head);
"""

DROP_NEW = """
DROP TRIGGER agent_run_head_postponed ON agent_run;
DROP TABLE agent_subject_head;
DROP FUNCTION agent_run_head_postponed();
DROP FUNCTION refuse_agent_subject_head_write();
"""

# Revision 0029's text of the four functions, whole.
OLD_FUNCTIONS = """
-- The lanes made exact: each pending delta is applied to a lane this claimer can lock (SKIP
-- LOCKED: a lane another claimer is folding is left to it), and the first offered head of each
-- band a delta names is looked up again (one index probe per band). `locked` is materialised:
-- every lane is locked (or skipped) once, before any delta is taken, so a fold never takes some
-- of a lane's deltas (those seen after another folder let go) and not the others. The new count
-- adds the deltas to the count read under that lock (the lane's newest version, which nobody
-- else can change until this transaction ends), never to the version the statement's snapshot
-- saw: another folder may have committed a newer one in between. agent_claim runs the same
-- statement inline.
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

CREATE OR REPLACE FUNCTION agent_run_enqueued() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM agent_subject_lock(NEW.workspace, NEW.subject);
    NEW.head := NOT EXISTS (
        SELECT 1 FROM agent_run r
        WHERE r.workspace = NEW.workspace AND r.subject = NEW.subject AND r.head);
    RETURN NEW;
END
$$;

-- Once per updating statement, set-based, without pairing the transition tables' rows (a join
-- of the two is a nested loop, quadratic in the rows one statement moves): a workspace's leased
-- delta is its new leased rows minus its old ones, and the bands to look up again are those of
-- every queued row version, old or new (a renewal adds nothing and writes no row). A subject's
-- next run is promoted when one of its runs ended; the promotion itself checks that the subject
-- has no head left.
CREATE OR REPLACE FUNCTION agent_run_moved() RETURNS trigger LANGUAGE plpgsql
SET jit = off
SET search_path FROM CURRENT
AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;  -- the promotions below: their lanes are told already
    END IF;
    -- A claim takes a head out of its band and a lease; a lease given back to the queue offers
    -- its run again; a queued head that ended leaves its band; an ended lease is one fewer.
    INSERT INTO agent_workspace_delta (workspace, leased, bands)
        SELECT m.workspace, sum(m.leased), bit_or(m.bands)::smallint
        FROM (SELECT n.workspace, CASE WHEN n.state = 'leased' THEN 1 ELSE 0 END AS leased,
                     CASE WHEN n.state = 'queued' THEN 1 << n.band ELSE 0 END AS bands
              FROM new_runs n
              UNION ALL
              SELECT o.workspace, CASE WHEN o.state = 'leased' THEN -1 ELSE 0 END,
                     CASE WHEN o.state = 'queued' THEN 1 << o.band ELSE 0 END
              FROM old_runs o) m
        GROUP BY m.workspace
        HAVING sum(m.leased) <> 0 OR bit_or(m.bands) <> 0;
    IF NOT EXISTS (SELECT 1 FROM new_runs n WHERE n.state = 'ended') THEN
        RETURN NULL;
    END IF;
    -- A subject whose run ended goes to its first waiting run if it has no head left, under
    -- the subject's lock: an enqueue of the subject either committed before (and its run is
    -- found here) or runs after (and finds this new head, or none).
    PERFORM agent_subject_lock(s.workspace, s.subject)
        FROM (SELECT DISTINCT n.workspace, n.subject FROM new_runs n WHERE n.state = 'ended'
              ORDER BY 1, 2) s;
    WITH promoted AS (
        UPDATE agent_run r SET head = true
        WHERE r.id = ANY (ARRAY(SELECT nx.id
          FROM (SELECT DISTINCT n.workspace, n.subject FROM new_runs n
                WHERE n.state = 'ended') s
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


def upgrade() -> None:
    op.execute(TABLE)
    op.execute(FUNCTIONS)
    op.execute(NEW_OBJECTS)


def downgrade() -> None:
    op.execute(FLAG_PROMOTED)
    op.execute(DROP_NEW)
    op.execute(OLD_FUNCTIONS)
