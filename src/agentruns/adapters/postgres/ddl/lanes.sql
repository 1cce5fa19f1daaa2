-- A subject's head and the workspaces' lanes (ADRs/0017).
--
-- A subject's head is a flag on its run: the subject's leased run, or else its first queued run.
-- uq_agent_run_head allows one head per (workspace, subject), and a leased run must be its
-- subject's head (the table's ck_agent_run_head), so one lease per subject and subject FIFO hold
-- whoever writes. A new run becomes head under the subject's advisory lock when its subject has
-- none (agent_run_enqueued); a run that ends hands the subject to its next waiting run under the
-- same lock (agent_run_moved).
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
-- band a delta names is looked up again (one index probe per band). `locked` is materialised:
-- every lane is locked (or skipped) once, before any delta is taken, so a fold never takes some
-- of a lane's deltas (those seen after another folder let go) and not the others. The new count
-- adds the deltas to the count read under that lock (the lane's newest version, which nobody
-- else can change until this transaction ends), never to the version the statement's snapshot
-- saw: another folder may have committed a newer one in between. agent_claim runs the same
-- statement inline.
CREATE FUNCTION agent_lane_fold() RETURNS void LANGUAGE sql
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

-- A new run is its subject's head when the subject has none; the subject's advisory lock orders
-- it against a head that ends at the same time (see agent_run_moved). No SET clause, so the
-- planner inlines the body into its callers; every name in it is pg_catalog's, qualified, so it
-- resolves alike whatever the caller's search_path.
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
        WHERE r.workspace = NEW.workspace AND r.subject = NEW.subject AND r.head);
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

-- Once per updating statement, set-based, without pairing the transition tables' rows (a join
-- of the two is a nested loop, quadratic in the rows one statement moves): a workspace's leased
-- delta is its new leased rows minus its old ones, and the bands to look up again are those of
-- every queued row version, old or new (a renewal adds nothing and writes no row). A subject's
-- next run is promoted when one of its runs ended; the promotion itself checks that the subject
-- has no head left.
CREATE FUNCTION agent_run_moved() RETURNS trigger LANGUAGE plpgsql
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

CREATE TRIGGER agent_run_moved AFTER UPDATE ON agent_run
    REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs
    FOR EACH STATEMENT EXECUTE FUNCTION agent_run_moved();

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
