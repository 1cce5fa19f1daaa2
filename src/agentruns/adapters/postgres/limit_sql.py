"""Every SQL statement of the PostgreSQL limit store, named, in one place (ADRs/0032).

They restate the token-bucket rule of :mod:`agentruns.domain.provider_limits` (the memory
store applies it as written there); the contract suite (tests/contract/test_limits.py) holds the
two together, as it does the claim order. The bursts and rates are the domain's, written with
the definition; a statement only refills and lowers. Time comes from
:data:`~agentruns.adapters.postgres.sql.NOW`, as in the run statements.

A take is one UPDATE of its limit's row. Its first step locks the row and reads it whole
(``locked``): under READ COMMITTED a lock that waited reads the version the take before it
committed, so each take sees the level the one before it left and no two grant the same tokens.
"""

from __future__ import annotations

from agentruns.adapters.postgres.sql import NOW, statement

LIMIT_COLUMNS = "name, requests, tokens, per_seconds"

# The amounts of a take, as bound.
_TAKEN = {
    "requests": "CAST(:requests AS double precision)",
    "tokens": "CAST(:tokens AS double precision)",
}

# A limit's buckets refilled to clock.now (never emptied by a clock before level_at), and what a
# take of :requests and :tokens needs of each: the amount, or a full bucket for a larger take
# (NULL: the dimension is not limited or not asked for).
_LEVELS = """
levels AS (
    SELECT l.name, l.requests, l.tokens, l.requests_rate, l.tokens_rate, l.paused_until,
           clock.now, GREATEST(clock.now, l.level_at) AS at,
           CASE WHEN l.requests IS NULL THEN 0 ELSE LEAST(l.requests_burst, l.requests_level
               + l.requests_rate * GREATEST(0, CAST(EXTRACT(EPOCH FROM clock.now - l.level_at)
                                                    AS double precision))) END AS r,
           CASE WHEN l.tokens IS NULL THEN 0 ELSE LEAST(l.tokens_burst, l.tokens_level
               + l.tokens_rate * GREATEST(0, CAST(EXTRACT(EPOCH FROM clock.now - l.level_at)
                                                  AS double precision))) END AS t,
           CASE WHEN l.requests IS NULL OR {requests} = 0 THEN NULL
                ELSE LEAST({requests}, l.requests_burst) END AS need_r,
           CASE WHEN l.tokens IS NULL OR {tokens} = 0 THEN NULL
                ELSE LEAST({tokens}, l.tokens_burst) END AS need_t
    FROM {source}, clock
),
verdict AS (
    SELECT levels.*, GREATEST(
        CASE WHEN paused_until > now
             THEN CAST(EXTRACT(EPOCH FROM paused_until - now) AS double precision) ELSE 0 END,
        CASE WHEN need_r IS NULL OR r >= need_r THEN 0 ELSE (need_r - r) / requests_rate END,
        CASE WHEN need_t IS NULL OR t >= need_t THEN 0 ELSE (need_t - t) / tokens_rate END
    ) AS wait
    FROM levels
)
"""

# A new limit starts full; a changed one keeps what it holds now, at most its new bursts, and a
# dimension it newly limits starts full (provider_limits.redeclared).
DECLARE = statement(f"""
WITH clock AS (SELECT {NOW} AS now)
INSERT INTO agent_limit (name, requests, tokens, per_seconds, requests_burst, requests_rate,
                         tokens_burst, tokens_rate, requests_level, tokens_level, level_at)
SELECT :name, :requests, :tokens, :per_seconds, :requests_burst, :requests_rate,
       :tokens_burst, :tokens_rate, :requests_burst, :tokens_burst, clock.now
FROM clock
ON CONFLICT (name) DO UPDATE SET
    requests_level = CASE
        WHEN EXCLUDED.requests IS NULL THEN 0
        WHEN agent_limit.requests IS NULL THEN EXCLUDED.requests_burst
        ELSE LEAST(EXCLUDED.requests_burst, agent_limit.requests_burst,
                   agent_limit.requests_level + agent_limit.requests_rate * GREATEST(0,
                       CAST(EXTRACT(EPOCH FROM EXCLUDED.level_at - agent_limit.level_at)
                            AS double precision))) END,
    tokens_level = CASE
        WHEN EXCLUDED.tokens IS NULL THEN 0
        WHEN agent_limit.tokens IS NULL THEN EXCLUDED.tokens_burst
        ELSE LEAST(EXCLUDED.tokens_burst, agent_limit.tokens_burst,
                   agent_limit.tokens_level + agent_limit.tokens_rate * GREATEST(0,
                       CAST(EXTRACT(EPOCH FROM EXCLUDED.level_at - agent_limit.level_at)
                            AS double precision))) END,
    level_at = GREATEST(EXCLUDED.level_at, agent_limit.level_at),
    requests = EXCLUDED.requests, tokens = EXCLUDED.tokens, per_seconds = EXCLUDED.per_seconds,
    requests_burst = EXCLUDED.requests_burst, requests_rate = EXCLUDED.requests_rate,
    tokens_burst = EXCLUDED.tokens_burst, tokens_rate = EXCLUDED.tokens_rate
""")

# Granted when not paused and each bucket holds what it needs: both lowered by the take. Either
# way the row keeps its refilled level, and the answer is how long until such a take can be
# granted (0: granted now). No row: the limit was never declared.
TAKE = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
locked AS (SELECT * FROM agent_limit WHERE name = :name FOR UPDATE),
{_LEVELS.format(source="locked l", **_TAKEN)}
UPDATE agent_limit SET
    requests_level = CASE WHEN v.requests IS NULL THEN 0 WHEN v.wait > 0 THEN v.r
                          ELSE v.r - CAST(:requests AS double precision) END,
    tokens_level = CASE WHEN v.tokens IS NULL THEN 0 WHEN v.wait > 0 THEN v.t
                        ELSE v.t - CAST(:tokens AS double precision) END,
    level_at = v.at
FROM verdict v
WHERE agent_limit.name = v.name
RETURNING v.wait
""")

# The later of the pause it has and :until. No row: never declared.
PAUSE = statement("""
UPDATE agent_limit SET paused_until = GREATEST(paused_until, :until)
WHERE name = :name
RETURNING name
""")

# Which of :names could not grant one request and one token now, and for how long: what a
# claim asks before it leases a run that draws from them (a name never declared limits nothing).
EMPTY = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
{
    _LEVELS.format(
        source="(SELECT * FROM agent_limit WHERE name = ANY(:names)) l", requests="1", tokens="1"
    )
}
SELECT name, wait FROM verdict WHERE wait > 0 ORDER BY name
""")

# A worker's claim of kinds that draw from provider limits, in one statement with the read of
# those limits (ADRs/0032): :names are every limit the kinds draw from, and the limits that could
# not grant one request and one token now come back on every row with their waits (the one row
# of NULLs too, when nothing was claimed). While none is empty and the database has seen no kind
# outside :kinds, the lane claim serves, as in CLAIM_IF_KNOWN; an empty limit leaves some kind
# out, so the lane claim takes nothing (limit 0: the function returns at once) and the store
# claims the kinds with room by CLAIM_KINDS.
CLAIM_IF_ROOM = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
{
    _LEVELS.format(
        source="(SELECT * FROM agent_limit WHERE name = ANY(:names)) l", requests="1", tokens="1"
    )
},
empty AS MATERIALIZED (SELECT name, wait FROM verdict WHERE wait > 0),
f AS MATERIALIZED (
    SELECT ARRAY(SELECT name FROM empty ORDER BY name) AS empty_names,
           ARRAY(SELECT wait FROM empty ORDER BY name) AS empty_waits,
           EXISTS (SELECT 1 FROM empty) OR EXISTS (
               SELECT 1 FROM agent_kind k WHERE k.name <> ALL (CAST(:kinds AS text[]))
           ) AS foreign_kinds
)
SELECT f.empty_names, f.empty_waits, f.foreign_kinds, c.*
FROM f LEFT JOIN LATERAL agent_claim(
    CAST(:now AS timestamptz), CAST(:aging AS interval), :holder,
    CASE WHEN f.foreign_kinds THEN 0 ELSE CAST(:limit AS integer) END, CAST(:alone AS boolean)
) c ON true
""")

ALL = statement(f"SELECT {LIMIT_COLUMNS} FROM agent_limit ORDER BY name")
