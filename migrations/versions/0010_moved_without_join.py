"""The moved-runs trigger without joining its transition tables.

Revision ID: 0010_moved_without_join
Revises: 0009_console_indexes

``agent_run_moved`` (0005) matched each old row version to its new one with a join of the
statement's two transition tables, which PostgreSQL plans as a nested loop over both: quadratic
in the rows one statement moves. A claim or a group end of 64 runs paid ~4,000 comparisons; a
reaper's take-back of 1,000 runs paid 128 ms of its 200 (ADRs/0017). The ledger needs no pairs:
a workspace's leased delta is its new leased rows minus its old ones, and the bands to look up
again are those of every queued row version, old or new (a renewal adds nothing and writes no
row). A subject's next run is promoted when one of its runs ended (the promotion itself checks
that the subject has no head left), so the old versions' head flags are not needed either.
"""

from __future__ import annotations

from alembic import op

revision = "0010_moved_without_join"
down_revision = "0009_console_indexes"
branch_labels = None
depends_on = None

MOVED = """
CREATE OR REPLACE FUNCTION agent_run_moved() RETURNS trigger LANGUAGE plpgsql AS $$
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
"""


# 0005's trigger function, which joined the transition tables: a downgrade restores it.
PAIRED_MOVED = """
CREATE OR REPLACE FUNCTION agent_run_moved() RETURNS trigger LANGUAGE plpgsql AS $$
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
"""


def upgrade() -> None:
    op.execute(MOVED)


def downgrade() -> None:
    op.execute(PAIRED_MOVED)
