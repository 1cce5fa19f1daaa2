-- A subject's head and the workspaces' lanes (ADRs/0017, ADRs/0036).
--
-- A subject's head is its leased run, or else its first queued run. A run that is head when it is
-- enqueued or leased carries the flag on its row (`head`); a run promoted when its subject's head
-- ended is named instead by the subject's narrow row in agent_subject_head until its claim, so a
-- promotion writes that row (three short index entries) and never rewrites the run through its
-- indexes. Its claim, a write of the run that happens anyway, flags it head, and the statement's
-- trigger deletes the row (agent_run_moved). uq_agent_run_head allows one flagged head per
-- (workspace, subject), the table's key one named head, a leased run must be flagged (the
-- table's ck_agent_run_head), and a run is flagged only by taking the head its subject's row
-- names, if it names one (agent_run_moved refuses the rest): one lease per subject and subject
-- FIFO hold whoever writes. A new run becomes head under the subject's advisory lock when its
-- subject has none (agent_run_enqueued); a run that ends hands the subject to its next waiting run
-- under the same lock (agent_run_moved). Only agent_run's triggers write agent_subject_head.
--
-- Each agent_workspace row is the workspace's lane: its leased runs and the first offered head of
-- each band, indexed in claim order per band, so a claim reads about `limit` lanes whatever the
-- number of workspaces. Every change a lane must hear of (a lease taken or given back, an end, a
-- take-back, a new head) is written to agent_workspace_delta and folded into the lanes by the
-- next claim (claim.sql), so nothing but a claim ever locks a lane row, and a single-tenant host
-- never queues its ends on one hot row.

-- A renewal changes only leased_until, which no index covers: it is a HOT update, with room left
-- on the page for it.
ALTER TABLE agent_run SET (fillfactor = 80);
ALTER TABLE agent_workspace SET (fillfactor = 50);

CREATE UNIQUE INDEX uq_agent_run_head ON agent_run (workspace, subject) WHERE head;
-- A parked run (a wait or a sleep that has not ended: ADRs/0029) is not offered, whatever the
-- number of them; the claim finds the parked runs whose wait has ended by the second index.
CREATE INDEX ix_agent_run_offered ON agent_run (workspace, band, due_at, seq)
    WHERE state = 'queued' AND head AND NOT parked;
CREATE INDEX ix_agent_run_parked ON agent_run (waiting_until) WHERE state = 'queued' AND parked;
-- The promoted heads in the claim's order (never parked: a wait parks a run given back by its
-- lease, flagged head by its claim). Partial on a predicate that always holds, so that only a
-- read that names a band (which implies it) can use the index: a subject's probe names none, and
-- can only use the table's key. On a table planned as empty the two indexes cost the same, and
-- a probe by (workspace, subject) through this one read every name of the workspace (ADRs/0037).
CREATE INDEX ix_agent_subject_head_offered ON agent_subject_head (workspace, band, due_at, seq)
    WHERE band IS NOT NULL;
CREATE INDEX ix_agent_run_waiting ON agent_run (workspace, subject, seq)
    WHERE state = 'queued' AND NOT head;
-- The reaper finds expired leases here (the expiry itself is not indexed: see above).
CREATE INDEX ix_agent_run_leased ON agent_run (seq) WHERE state = 'leased';

CREATE INDEX ix_agent_workspace_b0 ON agent_workspace (leased, h0_due, h0_seq)
    WHERE active AND h0_due IS NOT NULL;
CREATE INDEX ix_agent_workspace_b1 ON agent_workspace (leased, h1_due, h1_seq)
    WHERE active AND h1_due IS NOT NULL;
CREATE INDEX ix_agent_workspace_b2 ON agent_workspace (leased, h2_due, h2_seq)
    WHERE active AND h2_due IS NOT NULL;

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
CREATE FUNCTION agent_lane_fold() RETURNS void LANGUAGE sql
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

-- A new run is its subject's head when the subject has none; the subject's advisory lock orders it
-- against a head that ends at the same time (see agent_run_moved). A subject with a run not ended
-- always has one head, flagged (its leased run, or a queued one) or named (a queued one), so it
-- has none exactly when it has no flagged head and no queued run that is not flagged: a probe of
-- uq_agent_run_head and, only without a flagged head, one of ix_agent_run_waiting (empty in a
-- queue of unique subjects), never of agent_subject_head. The lock function has no SET clause, so
-- the planner inlines its body into its callers; every name in it is pg_catalog's, qualified, so
-- it resolves alike whatever the caller's search_path.
CREATE FUNCTION agent_subject_lock(workspace text, subject text) RETURNS void
LANGUAGE sql
AS $$
    SELECT pg_catalog.pg_advisory_xact_lock(
        pg_catalog.hashtext('agentruns.subject'),
        pg_catalog.hashtext(
            workspace OPERATOR(pg_catalog.||) pg_catalog.chr(31) OPERATOR(pg_catalog.||) subject))
$$;

CREATE FUNCTION agent_run_enqueued() RETURNS trigger LANGUAGE plpgsql
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

CREATE TRIGGER agent_run_enqueued BEFORE INSERT ON agent_run
    FOR EACH ROW EXECUTE FUNCTION agent_run_enqueued();

-- Once per inserting statement: the workspaces' rows, the kinds seen (a worker that knows them
-- all claims through the lanes: ADRs/0021), the new heads' lanes, the wake-up.
CREATE FUNCTION agent_run_inserted() RETURNS trigger LANGUAGE plpgsql
SET jit = off
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO agent_workspace (id) SELECT DISTINCT workspace FROM inserted
        ON CONFLICT DO NOTHING;
    INSERT INTO agent_kind (name) SELECT DISTINCT kind FROM inserted
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

-- agent_subject_head is often empty when a session first plans a statement that reads it (after a
-- vacuum of an idle queue, or in a queue whose subjects have one run each), and PL/pgSQL keeps that
-- plan for the session. A plan made for an empty table read it whole for each subject once it held
-- thousands of rows: an end of 256 runs took 50 ms in its promotion instead of 5. So every read of
-- it is its key's probe with the subject as a parameter (a LATERAL with a LIMIT, or a scalar
-- subquery, which the planner cannot turn into a join or, as it does an EXISTS, into a hash of
-- the whole table), its key is the only index such a probe can use (ix_agent_subject_head_offered
-- above), rows are deleted by their ctid, and the functions run with sequential scans off (and so
-- with JIT off: before PostgreSQL 18 a disabled node's cost is past any jit_above_cost).

-- Once per updating statement, set-based, without pairing the transition tables' rows (a join
-- of the two is a nested loop, quadratic in the rows one statement moves): a workspace's leased
-- delta is its new leased rows minus its old ones, and the bands to look up again are those of
-- every queued row version, old or new (a renewal adds nothing and writes no row). A subject's
-- next run is promoted when one of its runs ended; the promotion itself checks that the subject
-- has no head left, flagged or named.
CREATE FUNCTION agent_run_moved() RETURNS trigger LANGUAGE plpgsql
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

CREATE TRIGGER agent_run_moved AFTER UPDATE ON agent_run
    REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs
    FOR EACH STATEMENT EXECUTE FUNCTION agent_run_moved();

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

-- A writer that ends a head without saying so still leaves the subject to its next run.
CREATE FUNCTION agent_run_unhead() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    NEW.head := false;
    RETURN NEW;
END
$$;

CREATE TRIGGER agent_run_unhead BEFORE UPDATE ON agent_run
    FOR EACH ROW WHEN (NEW.state = 'ended' AND NEW.head) EXECUTE FUNCTION agent_run_unhead();

-- A requeue or a take-back gives a run back to the queue: wake the claimers.
CREATE FUNCTION agent_run_requeued() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_notify('agent_run', NEW.workspace);
    RETURN NULL;
END
$$;

CREATE TRIGGER agent_run_requeued AFTER UPDATE ON agent_run
    FOR EACH ROW WHEN (OLD.state = 'leased' AND NEW.state = 'queued')
    EXECUTE FUNCTION agent_run_requeued();
