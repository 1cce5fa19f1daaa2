"""Every SQL statement of the PostgreSQL schedule store, named, in one place.

Time comes from :data:`~agentruns.adapters.postgres.sql.NOW` as in the run statements: the
bound ``:now`` when a test pins a clock, else the database clock. Nothing here reads or locks
the runs table: a tick's run is inserted by the run store, in the same transaction.
"""

from __future__ import annotations

from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.types import Text

from agentruns.adapters.postgres.sql import NOW

SCHEDULE_COLUMNS = (
    "name, kind, workspace, subject, band, payload, cron, every, timezone, catch_up, "
    "catch_up_limit, grace, paused, next_tick_at, last_tick_at, last_run, created_at, "
    "updated_at, removed_at"
)
_ACTIVE = "NOT paused AND removed_at IS NULL"


def _stmt(source: str) -> TextClause:
    clause = text(source)
    binds = []
    if ":payload" in source:
        binds.append(bindparam("payload", type_=JSONB))
    if ":kinds" in source:
        binds.append(bindparam("kinds", type_=ARRAY(Text)))
    return clause.bindparams(*binds) if binds else clause


# Replicas that start together sync one after another (a transaction-scoped advisory lock).
LOCK_SYNC = _stmt("SELECT pg_advisory_xact_lock(hashtext('agentruns.schedules.sync'))")

LIST = _stmt(f"SELECT {SCHEDULE_COLUMNS} FROM agent_schedule ORDER BY name")

# A sync holds every row it may rewrite, so a pass ticking one finishes first (or skips it).
LIST_LOCKED = _stmt(f"SELECT {SCHEDULE_COLUMNS} FROM agent_schedule ORDER BY name FOR UPDATE")

GET = _stmt(f"SELECT {SCHEDULE_COLUMNS} FROM agent_schedule WHERE name = :name")

GET_LOCKED = _stmt(f"SELECT {SCHEDULE_COLUMNS} FROM agent_schedule WHERE name = :name FOR UPDATE")

PUT = _stmt(f"""
INSERT INTO agent_schedule ({SCHEDULE_COLUMNS})
VALUES (:name, :kind, :workspace, :subject, :band, :payload, :cron, CAST(:every AS interval),
        :timezone, :catch_up, :catch_up_limit, :grace, :paused, :next_tick_at, :last_tick_at,
        :last_run, :created_at, :updated_at, :removed_at)
ON CONFLICT (name) DO UPDATE SET
    kind = EXCLUDED.kind, workspace = EXCLUDED.workspace, subject = EXCLUDED.subject,
    band = EXCLUDED.band, payload = EXCLUDED.payload, cron = EXCLUDED.cron,
    every = EXCLUDED.every, timezone = EXCLUDED.timezone, catch_up = EXCLUDED.catch_up,
    catch_up_limit = EXCLUDED.catch_up_limit, grace = EXCLUDED.grace, paused = EXCLUDED.paused,
    next_tick_at = EXCLUDED.next_tick_at, last_tick_at = EXCLUDED.last_tick_at,
    last_run = EXCLUDED.last_run, updated_at = EXCLUDED.updated_at,
    removed_at = EXCLUDED.removed_at
""")

DUE = _stmt(f"""
WITH clock AS (SELECT {NOW} AS now)
SELECT name FROM agent_schedule, clock
WHERE {_ACTIVE} AND next_tick_at <= clock.now AND kind = ANY(:kinds)
ORDER BY next_tick_at, name
LIMIT :limit
""")

# SKIP LOCKED: a schedule another replica holds is that replica's to tick this pass.
LOCK_DUE = _stmt(f"""
WITH clock AS (SELECT {NOW} AS now)
SELECT {SCHEDULE_COLUMNS} FROM agent_schedule, clock
WHERE name = :name AND {_ACTIVE} AND next_tick_at <= clock.now
FOR UPDATE OF agent_schedule SKIP LOCKED
""")

NEXT_DUE = _stmt(f"""
SELECT min(next_tick_at) AS next_tick_at FROM agent_schedule
WHERE {_ACTIVE} AND kind = ANY(:kinds)
""")

# The unique key decides: a tick claimed before (or by a transaction that commits first) is a
# no-op here, and the caller enqueues nothing for it.
CLAIM_TICK = _stmt(f"""
WITH clock AS (SELECT {NOW} AS now)
INSERT INTO agent_schedule_tick (schedule, tick_at, enqueued_at)
SELECT :name, :tick_at, clock.now FROM clock
ON CONFLICT (schedule, tick_at) DO NOTHING
RETURNING tick_at
""")

RECORD_TICK = _stmt("""
UPDATE agent_schedule_tick SET run_id = :run_id WHERE schedule = :name AND tick_at = :tick_at
""")

TICKS = _stmt("""
SELECT schedule, tick_at, run_id, enqueued_at FROM agent_schedule_tick
WHERE schedule = :name ORDER BY tick_at DESC LIMIT :limit
""")

PRUNE_TICKS = _stmt("DELETE FROM agent_schedule_tick WHERE schedule = :name AND tick_at < :before")
