"""Fast synthetic populations for the claim's plan test and its cost benchmark.

Rows go in by one ``INSERT ... SELECT generate_series`` with the run triggers switched off for
that statement, and the bookkeeping the triggers would have kept (each subject's head, each
workspace's lane) is then built by set-based statements, exactly as the triggers define it.
"""

from __future__ import annotations

import psycopg

POPULATE = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt, seq,
                       enqueued_at, due_at, lease, leased_until, holder, end_reason, ended_at,
                       head)
SELECT gen_random_uuid(),
       CASE WHEN g %% 5 = 0 THEN 'review' ELSE 'chat' END,
       'ws-' || ((g %% %(subjects)s) %% %(workspaces)s),
       'subject-' || (g %% %(subjects)s),
       g %% 3,
       '{}',
       %(state)s, CASE WHEN %(state)s = 'queued' THEN 0 ELSE 1 END, 0,
       nextval('agent_run_seq'),
       now() - interval '2 hours',
       now() - make_interval(secs => g %% 7200),
       interval '30 seconds',
       CASE WHEN %(state)s = 'leased' THEN now() + interval '30 seconds' END,
       CASE WHEN %(state)s = 'leased' THEN 'bench' END,
       CASE WHEN %(state)s = 'ended' THEN 'completed' END,
       CASE WHEN %(state)s = 'ended' THEN now() END,
       %(state)s = 'leased'
FROM generate_series(1, %(count)s) AS g
"""

# What the triggers would have kept: each subject's head (its leased run, else its first queued
# run, flagged as an enqueue flags it: ADRs/0036), written with the triggers still off; then a row
# per workspace, and every lane folded (ADRs/0017).
HEADS = """
UPDATE agent_run r SET head = true
FROM (SELECT DISTINCT ON (q.workspace, q.subject) q.id
      FROM agent_run q
      WHERE q.state = 'queued' AND NOT EXISTS (
          SELECT 1 FROM agent_run l
          WHERE l.workspace = q.workspace AND l.subject = q.subject AND l.state = 'leased')
      ORDER BY q.workspace, q.subject, q.seq) h
WHERE r.id = h.id
"""

BOOKKEEPING = """
INSERT INTO agent_workspace (id) SELECT DISTINCT workspace FROM agent_run ON CONFLICT DO NOTHING;
INSERT INTO agent_workspace_delta (workspace, leased, bands)
SELECT w.id, (SELECT count(*) FROM agent_run r WHERE r.workspace = w.id AND r.state = 'leased')
       - w.leased, 7
FROM agent_workspace w;
SELECT agent_lane_fold();
"""


def populate(
    connection: psycopg.Connection[tuple[object, ...]],
    *,
    queued: int,
    workspaces: int,
    subjects: int,
    leased: int = 0,
    ended: int = 0,
) -> None:
    """``queued`` runs over ``workspaces`` and ``subjects`` (a subject stays in one workspace),
    plus ``leased`` runs on subjects of their own and ``ended`` finished runs; then ANALYZE."""
    with connection.transaction():
        connection.execute("ALTER TABLE agent_run DISABLE TRIGGER USER")
        shapes = [
            ("queued", queued, subjects),
            ("ended", ended, subjects),
            ("leased", leased, leased),
        ]
        for state, count, spread in shapes:
            if count == 0:
                continue
            sql = POPULATE
            if state == "leased":  # one leased run per subject, on subjects of their own
                sql = sql.replace("'subject-' ||", "'leased-' ||")
            connection.execute(
                sql,
                {"state": state, "count": count, "subjects": spread, "workspaces": workspaces},
            )
        connection.execute(HEADS)
        connection.execute("ALTER TABLE agent_run ENABLE TRIGGER USER")
        connection.execute(BOOKKEEPING)
    connection.execute("ANALYZE")
