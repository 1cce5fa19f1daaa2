"""Every SQL statement of the PostgreSQL holder store, named, in one place.

Time comes from :data:`~agentruns.adapters.postgres.sql.NOW` as in the run statements: the
bound ``:now`` when a test pins a clock, else the database clock. Each write is one statement on
one row, its holder's own: a holder's heartbeat never waits on another's.
"""

from __future__ import annotations

from agentruns.adapters.postgres.sql import NOW, statement

HOLDER_COLUMNS = "holder, process, kinds, renewal, started_at, seen_at, stopped_at"

# A new life of the holder: started and seen now, whatever a former row said.
STARTED = statement(f"""
WITH clock AS (SELECT {NOW} AS now)
INSERT INTO agent_holder (holder, process, kinds, renewal, started_at, seen_at)
SELECT :holder, :process, :kinds, :renewal, clock.now, clock.now FROM clock
ON CONFLICT (holder) DO UPDATE SET
    process = EXCLUDED.process, kinds = EXCLUDED.kinds, renewal = EXCLUDED.renewal,
    started_at = EXCLUDED.started_at, seen_at = EXCLUDED.seen_at, stopped_at = NULL
RETURNING {HOLDER_COLUMNS}
""")

# A beat: seen now, its start kept (GREATEST: a pinned clock may stand before a former start).
SEEN = statement(f"""
WITH clock AS (SELECT {NOW} AS now)
INSERT INTO agent_holder (holder, process, kinds, renewal, started_at, seen_at)
SELECT :holder, :process, :kinds, :renewal, clock.now, clock.now FROM clock
ON CONFLICT (holder) DO UPDATE SET
    process = EXCLUDED.process, kinds = EXCLUDED.kinds, renewal = EXCLUDED.renewal,
    seen_at = GREATEST(EXCLUDED.seen_at, agent_holder.started_at), stopped_at = NULL
RETURNING {HOLDER_COLUMNS}
""")

STOPPED = statement(f"""
WITH clock AS (SELECT {NOW} AS now)
UPDATE agent_holder SET seen_at = GREATEST(clock.now, started_at),
                        stopped_at = GREATEST(clock.now, started_at)
FROM clock WHERE holder = :holder
""")

ALL = statement(f"SELECT {HOLDER_COLUMNS} FROM agent_holder ORDER BY holder")

FORGET = statement(f"""
DELETE FROM agent_holder WHERE seen_at < {NOW} - CAST(:older_than AS interval)
""")
