"""Every SQL statement of the PostgreSQL sandbox store, named, in one place.

Time comes from :data:`~agentruns.adapters.postgres.sql.NOW` as in the run statements: the
bound ``:now`` when a test pins a clock, else the database clock. Each transition is one guarded
statement that touches the row only if it is still as expected; ``guard_agent_sandbox`` refuses
the rest.
"""

from __future__ import annotations

from agentruns.adapters.postgres.sql import NOW, statement

SANDBOX_COLUMNS = (
    "id, kind, workspace, subject, state, requested_at, ready_at, last_used_at, shutdown_at, "
    "claim_name, conversation"
)
_LIVE = "state IN ('requested', 'ready')"


INSERT = statement(f"""
INSERT INTO agent_sandbox (id, kind, workspace, subject, state, requested_at, shutdown_at,
                           claim_name, conversation)
VALUES (:id, :kind, :workspace, :subject, 'requested', :requested_at, :shutdown_at,
        :claim_name, :conversation)
ON CONFLICT (workspace, subject) WHERE {_LIVE} DO NOTHING
RETURNING {SANDBOX_COLUMNS}
""")

GET = statement(f"SELECT {SANDBOX_COLUMNS} FROM agent_sandbox WHERE id = :id")

LIVE_OF_SUBJECT = statement(
    f"SELECT {SANDBOX_COLUMNS} FROM agent_sandbox "
    f"WHERE workspace = :workspace AND subject = :subject AND {_LIVE}"
)

# Held until the caller's transaction ends: the reaper's take-back skips a locked row, and one
# that the reaper moved first no longer matches when this statement gets the lock.
LOCK_LIVE = statement(f"""
WITH clock AS (SELECT {NOW} AS now)
SELECT {SANDBOX_COLUMNS} FROM agent_sandbox, clock
WHERE id = :id AND {_LIVE} AND shutdown_at > clock.now
FOR UPDATE OF agent_sandbox
""")

# A row's times keep their order (ck_agent_sandbox_*): the first call is never before the
# request, and the last use never moves back nor passes the shutdown. Each statement decides on
# its transaction's clock, which may have started before another call that locked the row first.
MARK_READY = statement(f"""
WITH clock AS (SELECT {NOW} AS now)
UPDATE agent_sandbox SET state = 'ready', ready_at = GREATEST(clock.now, requested_at)
FROM clock WHERE id = :id AND state = 'requested' AND shutdown_at > clock.now
RETURNING {SANDBOX_COLUMNS}
""")

TOUCH = statement(f"""
WITH clock AS (SELECT {NOW} AS now)
UPDATE agent_sandbox SET last_used_at = GREATEST(clock.now, ready_at, last_used_at)
FROM clock
WHERE id = :id AND state = 'ready' AND shutdown_at > clock.now
RETURNING {SANDBOX_COLUMNS}
""")

TAKE_BACK = statement(f"""
UPDATE agent_sandbox SET state = 'deleting' WHERE id = :id AND {_LIVE}
RETURNING {SANDBOX_COLUMNS}
""")

# The sandbox reaper's one statement: the domain's take_back_cause, on the database clock. The
# two NOT EXISTS read the runs' partial indexes over queued and leased runs of the subject.
TAKE_BACK_DUE = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
due AS (
    SELECT s.id FROM agent_sandbox s, clock
    WHERE s.{_LIVE}
      AND (s.shutdown_at <= clock.now
           OR (s.state = 'requested'
               AND s.requested_at + CAST(:start AS interval) <= clock.now)
           OR (NOT EXISTS (SELECT 1 FROM agent_run r
                           WHERE r.workspace = s.workspace AND r.subject = s.subject
                             AND r.state = 'queued')
               AND NOT EXISTS (SELECT 1 FROM agent_run r
                               WHERE r.workspace = s.workspace AND r.subject = s.subject
                                 AND r.state = 'leased')
               AND COALESCE(s.last_used_at, s.ready_at, s.requested_at)
                   + CASE WHEN s.conversation THEN CAST(:conversation_idle AS interval)
                          ELSE CAST(:idle AS interval) END <= clock.now))
    ORDER BY s.requested_at
    LIMIT :limit
    FOR UPDATE OF s SKIP LOCKED
)
UPDATE agent_sandbox SET state = 'deleting'
FROM due WHERE agent_sandbox.id = due.id
RETURNING {", ".join(f"agent_sandbox.{c.strip()}" for c in SANDBOX_COLUMNS.split(","))}
""")

DELETING = statement(f"""
SELECT {SANDBOX_COLUMNS} FROM agent_sandbox WHERE state = 'deleting'
ORDER BY requested_at LIMIT :limit
""")

DELETE = statement("DELETE FROM agent_sandbox WHERE id = :id AND state = 'deleting'")

CLAIM_NAMES = statement(
    "SELECT claim_name FROM agent_sandbox WHERE claim_name = ANY(CAST(:names AS text[]))"
)

# The console's sandboxes page: live first, newest request first (a few hundred rows at most).
LISTING = statement(f"""
SELECT {SANDBOX_COLUMNS} FROM agent_sandbox
ORDER BY state = 'deleting', requested_at DESC, id LIMIT :limit
""")
