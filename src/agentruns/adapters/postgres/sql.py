"""The SQL statements of runs, events and workspaces, named, in one place; and :func:`statement`,
the one way every module of the adapter declares its statements (``sandbox_sql``, ``stats``).

Time: each statement reads ``now`` from :data:`NOW`: the bound ``:now`` when a test pins a clock,
else the database clock (``now()``, the transaction's start). One SQL text serves both.

Fenced writes are single guarded statements (``WHERE id, workspace, epoch, state = 'leased',
leased_until > now``); when one touches no row, the store reads the run once to say why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from typing import Any

from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.types import Text, TypeEngine

NOW = "COALESCE(CAST(:now AS timestamptz), now())"

RUN_COLUMNS = (
    "id, kind, workspace, subject, band, payload, state, epoch, attempt, seq, enqueued_at, "
    "due_at, lease, deadline_at, leased_until, holder, end_reason, ended_at, continues, "
    "domain_row, trace_context, last_error_type, last_error, last_failure_class, claimed_at"
)
_R_COLUMNS = ", ".join(f"r.{column.strip()}" for column in RUN_COLUMNS.split(","))

_FENCE = (
    "id = :run_id AND workspace = :workspace AND epoch = :epoch AND state = 'leased' "
    "AND leased_until > clock.now"
)

_KINDS = "(CAST(:kinds AS text[]) IS NULL OR {kind} = ANY(CAST(:kinds AS text[])))"


# Bind parameters whose type the driver cannot infer, by name, for every statement that names one.
_BIND_TYPES: dict[str, TypeEngine[Any]] = {
    "payload": JSONB(),
    "data": JSONB(),
    "kinds": ARRAY(Text),
    "names": ARRAY(Text),
    # The enqueuer's trace context: NULL when there is none, not the JSON null.
    "trace_context": JSONB(none_as_null=True),
    # A run's result (ADRs/0026): NULL when it has none, not the JSON null.
    "result": JSONB(none_as_null=True),
    "excluding": ARRAY(Text),
    "live": ARRAY(Text),
}


def statement(source: str) -> TextClause:
    """The one way the PostgreSQL adapter declares a statement: its SQL text, with the types of
    the bind parameters it names from :data:`_BIND_TYPES` (a JSON payload, a list of names)."""
    clause = text(source)
    named = set(re.findall(r"(?<!:):(\w+)", source))
    binds = [bindparam(name, type_=type_) for name, type_ in _BIND_TYPES.items() if name in named]
    return clause.bindparams(*binds) if binds else clause


NOW_SELECT = statement(f"SELECT {NOW} AS now")

# The insert of a new run, after its `clock` (and, for a key, the key's row) in a statement.
_INSERT_COLUMNS = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt,
                       enqueued_at, due_at, lease, deadline_at, continues, domain_row,
                       trace_context, enqueue_key)
SELECT :id, :kind, :workspace, :subject, :band, :payload, 'queued', :epoch, :attempt,
       clock.now, COALESCE(CAST(:due_at AS timestamptz), clock.now), :lease,
       COALESCE(CAST(:deadline_at AS timestamptz),
                clock.now + CAST(:deadline_after AS interval)),
       :continues, :domain_row, :trace_context, CAST(:key AS text)"""

INSERT_RUN = statement(f"""
WITH clock AS (SELECT {NOW} AS now)
{_INSERT_COLUMNS}
FROM clock
RETURNING {RUN_COLUMNS}, enqueue_key
""")

# An enqueue with a key (ADRs/0024), in one statement: the key is taken and the run inserted, or
# (the key names a run already) nothing is written and no row comes back. A second transaction
# racing for the same new key waits on the first's key row, and after its commit does nothing.
INSERT_KEYED = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
taken AS (
    INSERT INTO agent_run_key (workspace, key, run_id) VALUES (:workspace, :key, :id)
    ON CONFLICT (workspace, key) DO NOTHING
    RETURNING run_id
)
{_INSERT_COLUMNS}
FROM clock, taken
RETURNING {RUN_COLUMNS}, enqueue_key
""")

# The run a key names, its row locked until the transaction ends: an enqueue that finds the key
# past its run's retention moves it (REKEY) with no other enqueue of that key in between.
KEY_HOLDER = statement(f"""
SELECT run_id, {NOW} AS now FROM agent_run_key
WHERE workspace = :workspace AND key = :key FOR UPDATE
""")

REKEY = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
moved AS (
    UPDATE agent_run_key SET run_id = :id WHERE workspace = :workspace AND key = :key
    RETURNING run_id
)
{_INSERT_COLUMNS}
FROM clock, moved
RETURNING {RUN_COLUMNS}, enqueue_key
""")

# An enqueue with a policy other than queue (ADRs/0028) holds its subject with the lock every
# insert of the subject takes (agent_run_enqueued), in a statement of its own: under READ
# COMMITTED the next statement's snapshot then sees every run of the subject another enqueue
# committed before the lock was granted.
LOCK_SUBJECT = statement("SELECT agent_subject_lock(:workspace, :subject)")

# A subject's active runs: its head (leased, or its first queued run) and its waiting runs; an
# ended run is never a head. Read by a BitmapOr of uq_agent_run_head and
# ix_agent_run_queued_console.
ACTIVE_RUNS = statement(f"""
SELECT {RUN_COLUMNS}, enqueue_key, waiting_for, waiting_until FROM agent_run
WHERE workspace = :workspace AND subject = :subject AND (head OR state = 'queued')
ORDER BY seq
""")

# A run that may have ended is read from agent_run_all: it is in agent_run, or, once the reaper
# moved it, in agent_run_history (ADRs/0035); one key probe in each.
GET_RUN = statement(
    f"SELECT {RUN_COLUMNS}, enqueue_key, waiting_for, waiting_until, waiting_since, result, "
    f"input_tokens, output_tokens, cost, {NOW} AS now "
    "FROM agent_run_all WHERE id = :run_id"
)

LOCK_RUN = statement(f"SELECT {RUN_COLUMNS} FROM agent_run WHERE id = :run_id FOR UPDATE")

# A run LOCK_RUN did not find may have ended and moved (ADRs/0035): it is read where it rests,
# unlocked (nothing rewrites a run there), in a statement of its own, whose snapshot sees a move
# that committed while the lock waited.
MOVED_RUN = statement(f"SELECT {RUN_COLUMNS} FROM agent_run_history WHERE id = :run_id")

REQUIRE_CURRENT = statement(f"""
WITH clock AS (SELECT {NOW} AS now)
SELECT {RUN_COLUMNS} FROM agent_run, clock WHERE {_FENCE} FOR UPDATE OF agent_run
""")

RENEW = statement(f"""
WITH clock AS (SELECT {NOW} AS now)
UPDATE agent_run SET leased_until = clock.now + lease
FROM clock WHERE {_FENCE}
RETURNING {RUN_COLUMNS}
""")

# An ended run is no longer its subject's head. The trigger agent_run_moved hands the subject to
# its next waiting run, and tells the lanes of every lease taken or given back and every head
# that left, whoever writes (ADRs/0017).
END_FENCED = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
ended AS (
    UPDATE agent_run SET state = 'ended', head = false, leased_until = NULL,
                         end_reason = :reason, ended_at = clock.now, result = :result
    FROM clock WHERE {_FENCE}
    RETURNING {RUN_COLUMNS}, result
)
SELECT * FROM ended
""")

# An end without a fence of a leased run (a cancel: the reaper ends only queued runs so) tells its
# holder: a NOTIFY on channel agent_run_cancel with the run's id, sent at commit (ADRs/0023). The
# state it had is the row the statement read (``was``): a claim that committed between that read
# and the update's lock leaves the holder untold, and its heartbeat finds the end instead. The
# NOTIFY is an output column, so it is evaluated for each ended row (an unread one may not be).
END_UNFENCED = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
ended AS (
    UPDATE agent_run r SET state = 'ended', head = false, leased_until = NULL,
                           end_reason = :reason, ended_at = clock.now
    FROM clock, agent_run was
    WHERE r.id = :run_id AND was.id = r.id AND r.state IN ('queued', 'leased')
    RETURNING {_R_COLUMNS}, was.state AS was_state
)
SELECT ended.*,
       CASE WHEN ended.was_state = 'leased'
            THEN CAST(pg_notify('agent_run_cancel', CAST(ended.id AS text)) AS text) END AS told
FROM ended
""")

REQUEUE = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
requeued AS (
    UPDATE agent_run SET state = 'queued', attempt = attempt + :charge,
                         due_at = GREATEST(clock.now + CAST(:delay AS interval), clock.now),
                         leased_until = NULL, holder = NULL
    FROM clock WHERE {_FENCE} AND attempt + :charge <= :retry_budget
    RETURNING {RUN_COLUMNS}
)
SELECT * FROM requeued
""")

# A wait or a sleep (ADRs/0025): the lease given back under the fence, no attempt spent, the run
# due at the wait's end and still its subject's head (the requeue's write, and what it waits for).
# Parked until that end (ADRs/0029): out of the claim's index, offered again by the first claim
# after its end, or by its signal's wake-up.
PARK = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
parked AS (
    UPDATE agent_run SET state = 'queued', parked = CAST(:until AS timestamptz) > clock.now,
                         due_at = GREATEST(CAST(:until AS timestamptz), clock.now),
                         leased_until = NULL, holder = NULL,
                         waiting_for = CAST(:waiting_for AS text),
                         waiting_until = CAST(:until AS timestamptz),
                         waiting_since = CAST(:since AS timestamptz)
    FROM clock WHERE {_FENCE}
    RETURNING {RUN_COLUMNS}
)
SELECT * FROM parked
""")

CLEAR_WAIT = statement(f"""
WITH clock AS (SELECT {NOW} AS now)
UPDATE agent_run SET waiting_for = NULL, waiting_until = NULL, waiting_since = NULL
FROM clock WHERE {_FENCE}
RETURNING id
""")

# A signal wakes the run that waits for it: due now, waiting no more (guard_agent_run allows this
# queued -> queued write), and the claimers told, as an enqueue tells them.
WAKE = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
woken AS (
    UPDATE agent_run SET due_at = LEAST(due_at, clock.now), waiting_for = NULL,
                         waiting_until = NULL, waiting_since = NULL, parked = false
    FROM clock
    WHERE id = :run_id AND state = 'queued' AND waiting_until IS NOT NULL
      AND waiting_for = :name
    RETURNING workspace
)
SELECT CAST(pg_notify('agent_run', woken.workspace) AS text) AS told FROM woken
""")

# A merge's debounce (ADRs/0031): a queued run never claimed is due later. The only queued ->
# queued write of a run's due time besides a wake; guard_agent_run admits it at epoch 0 only.
POSTPONE = statement(f"""
UPDATE agent_run SET due_at = CAST(:due_at AS timestamptz)
WHERE id = :run_id AND state = 'queued' AND epoch = 0 AND waiting_until IS NULL
  AND due_at < CAST(:due_at AS timestamptz)
RETURNING {RUN_COLUMNS}
""")

_SIGNAL_COLUMNS = "id, run_id, name, signal_id, payload, delivered_at"

# Once per (run, signal id): a second delivery inserts nothing (and reads the first: SIGNAL_BY_ID).
DELIVER_SIGNAL = statement(f"""
INSERT INTO agent_run_signal (run_id, name, signal_id, payload, delivered_at)
VALUES (:run_id, :name, :signal_id, :payload, {NOW})
ON CONFLICT (run_id, signal_id) DO NOTHING
RETURNING {_SIGNAL_COLUMNS}
""")

SIGNAL_BY_ID = statement(f"""
SELECT {_SIGNAL_COLUMNS} FROM agent_run_signal WHERE run_id = :run_id AND signal_id = :signal_id
""")

SIGNAL_OF = statement(f"""
SELECT {_SIGNAL_COLUMNS} FROM agent_run_signal WHERE run_id = :run_id AND name = :name
ORDER BY id OFFSET :skip LIMIT 1
""")

SIGNALS = statement(f"""
SELECT {_SIGNAL_COLUMNS} FROM agent_run_signal WHERE run_id = :run_id ORDER BY id
""")

# Replicas share the reaping: a run another replica is taking back (its row locked) is skipped.
# The leased runs are read through ix_agent_run_leased (bounded by the worker slots); the
# expiry itself is not indexed, so that a renewal stays a HOT update.
EXPIRED = statement(f"""
SELECT {RUN_COLUMNS} FROM agent_run
WHERE state = 'leased' AND leased_until <= {NOW} AND {_KINDS.format(kind="kind")}
ORDER BY leased_until, seq LIMIT :limit
FOR UPDATE SKIP LOCKED
""")

# Expired leases no reaper of the given kinds will take back (ADRs/0014): left for a replica
# that knows their kind, and counted so the reaper can say so once in a while.
EXPIRED_KINDS = statement(f"""
SELECT kind, count(*) AS leases FROM agent_run
WHERE state = 'leased' AND leased_until <= {NOW} AND kind <> ALL(CAST(:excluding AS text[]))
GROUP BY kind ORDER BY kind
""")

_TAKE_BACK_REASON = (
    "CASE WHEN deadline_at IS NOT NULL AND deadline_at <= clock.now THEN 'deadline_exceeded' "
    "WHEN attempt >= :retry_budget THEN 'retries_exhausted' END"
)

# The conditional write of the take-back: only if still leased at the reaper's epoch and
# expired, so a renewal or another replica that won leaves nothing to write.
_TAKE_BACK_SET = f"""
    state = CASE WHEN {_TAKE_BACK_REASON} IS NULL THEN 'queued' ELSE 'ended' END,
    head = {_TAKE_BACK_REASON} IS NULL,
    end_reason = {_TAKE_BACK_REASON},
    ended_at = CASE WHEN {_TAKE_BACK_REASON} IS NULL THEN NULL ELSE clock.now END,
    attempt = attempt + CASE WHEN {_TAKE_BACK_REASON} IS NULL THEN 1 ELSE 0 END,
    due_at = CASE WHEN {_TAKE_BACK_REASON} IS NULL
                  THEN clock.now + CAST(:delay AS interval) ELSE due_at END,
    holder = CASE WHEN {_TAKE_BACK_REASON} IS NULL THEN NULL ELSE holder END,
    leased_until = NULL"""

TAKE_BACK = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
taken AS (
    UPDATE agent_run SET {_TAKE_BACK_SET}
    FROM clock
    WHERE id = :run_id AND epoch = :epoch AND state = 'leased' AND leased_until <= clock.now
    RETURNING {RUN_COLUMNS}
)
SELECT * FROM taken
""")

# The set-based take-back (ADRs/0017), for kinds without a domain row: one statement per batch,
# each row still conditional on its epoch and expiry, so a renewal that committed first wins
# (its row no longer matches and is left as it is). Each row brings its kind's budget and its
# backoff delay; rows another replica holds are skipped.
TAKE_BACK_MANY = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
-- The batch as one JSON array of [id, epoch, retry budget, delay in seconds, error type,
-- message, failure class, traceback] (one parameter, as the group writes: ADRs/0019).
w AS (
    SELECT CAST(e.v ->> 0 AS uuid) AS id, CAST(e.v ->> 1 AS integer) AS epoch,
           CAST(e.v ->> 2 AS integer) AS retry_budget,
           make_interval(secs => CAST(e.v ->> 3 AS double precision)) AS delay,
           e.v ->> 4 AS error_type, e.v ->> 5 AS message, e.v ->> 6 AS failure_class,
           e.v ->> 7 AS traceback
    FROM jsonb_array_elements(CAST(:take_backs AS jsonb)) AS e(v)
),
-- Each run is found by its key alone and checked once locked (its newest version): with the
-- state in the lookup, a planner whose statistics saw few leased runs reads the leased index
-- whole for every run (quadratic in the batch). OFFSET 0 keeps the checks out of the lookup.
-- The reaper holds these rows locked already.
due AS (
    SELECT r.id, r.epoch AS was_epoch, r.attempt AS was_attempt, r.holder AS was_holder,
           w.retry_budget, w.delay, w.error_type, w.message, w.failure_class, w.traceback
    FROM w CROSS JOIN LATERAL (
        SELECT r.id, r.epoch, r.attempt, r.holder, r.state, r.leased_until FROM agent_run r
        WHERE r.id = w.id
        FOR UPDATE OF r SKIP LOCKED OFFSET 0) r, clock
    WHERE r.epoch = w.epoch AND r.state = 'leased' AND r.leased_until <= clock.now
),
taken AS (
    UPDATE agent_run r SET {
    _TAKE_BACK_SET.replace(":retry_budget", "due.retry_budget").replace(
        "CAST(:delay AS interval)", "due.delay"
    )
},
        last_error_type = COALESCE(due.error_type, r.last_error_type),
        last_error = COALESCE(due.message, r.last_error),
        last_failure_class = COALESCE(due.failure_class, r.last_failure_class)
    FROM clock, due WHERE r.id = due.id AND r.id = ANY (ARRAY(SELECT id FROM due))
    RETURNING {_R_COLUMNS}, due.was_epoch, due.was_attempt, due.was_holder,
              due.error_type AS failed_type, due.message AS failed_message,
              due.failure_class AS failed_class, due.traceback AS failed_traceback,
              clock.now AS failed_at
),
recorded AS (
    INSERT INTO agent_run_failure (run_id, epoch, attempt, holder, error_type, message,
                                   failure_class, traceback, recorded_at)
    SELECT id, was_epoch, was_attempt, was_holder, failed_type, failed_message, failed_class,
           failed_traceback, failed_at
    FROM taken WHERE failed_type IS NOT NULL
)
SELECT {RUN_COLUMNS} FROM taken
""")

OVERDUE = statement(f"""
SELECT {RUN_COLUMNS} FROM agent_run
WHERE state = 'queued' AND deadline_at IS NOT NULL AND deadline_at <= {NOW}
  AND {_KINDS.format(kind="kind")}
ORDER BY deadline_at, seq LIMIT :limit
""")

# A failed attempt (ADRs/0014): the run, still leased at the failure's epoch, takes it as its
# last failure (a leased -> leased update: no head moves, no wake-up) and the record is appended,
# in one statement. Written only on failure, never on a successful step or end.
_FAILURE_COLUMNS = (
    "run_id, id, epoch, attempt, holder, error_type, message, failure_class, traceback, "
    "recorded_at, retry_after"
)

RECORD_FAILURE = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
noted AS (
    UPDATE agent_run SET last_error_type = :error_type, last_error = :message,
                         last_failure_class = :failure_class
    FROM clock WHERE id = :run_id AND epoch = :epoch AND state = 'leased'
    RETURNING id, epoch, attempt, holder, clock.now AS now
)
INSERT INTO agent_run_failure (run_id, epoch, attempt, holder, error_type, message,
                               failure_class, traceback, recorded_at, retry_after)
SELECT noted.id, noted.epoch, noted.attempt, noted.holder, :error_type, :message,
       :failure_class, :traceback, noted.now, CAST(:retry_after AS double precision)
FROM noted
RETURNING {_FAILURE_COLUMNS}
""")

CONTINUATION_OF = statement(f"""
SELECT {RUN_COLUMNS} FROM agent_run_all WHERE continues = :run_id ORDER BY seq LIMIT 1
""")

# An id prefix is the range of ids it covers: the primary key's index, never a text scan.
IDS_BETWEEN = statement("""
SELECT id FROM agent_run_all WHERE id BETWEEN :low AND :high ORDER BY id LIMIT :limit
""")

LIST_FAILURES = statement(f"""
SELECT {_FAILURE_COLUMNS} FROM agent_run_failure WHERE run_id = :run_id ORDER BY id
""")

# The ended runs the reaper moved from agent_run in one statement, at most :limit, first in
# queue order (ADRs/0035): the function agent_run_archive (ddl/history.sql).
ARCHIVE = statement("SELECT agent_run_archive(:limit) AS moved")

# A purged run's key goes with it, unless the key names a later run already (ADRs/0024), and
# its signals go with it (ADRs/0025); its events, failures and watchers go with it through
# agent_run_gone (ddl/history.sql). The batch is taken from the history by end time, and, when
# that leaves room in it, from the ended runs agent_run still has (those the reaper has not
# moved yet, or all of them where a host's foreign key keeps them there, ADRs/0035), in queue
# order. Each is deleted by key from an array: on the generic plan a join to the batch is planned
# on a guess of the LIMIT (a tenth of the ended runs), which on a table of mostly ended runs is a
# scan of every run per batch.
PURGE = statement("""
WITH doomed AS MATERIALIZED (
    SELECT id FROM agent_run_history
    WHERE ended_at < :ended_before
    ORDER BY ended_at LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
unmoved AS (
    SELECT id FROM agent_run
    WHERE state = 'ended' AND ended_at < :ended_before
    ORDER BY seq LIMIT GREATEST(:limit - (SELECT count(*) FROM doomed), 0)
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM agent_run_history WHERE id = ANY (ARRAY(SELECT id FROM doomed))
    RETURNING id, workspace, enqueue_key
),
gone_unmoved AS (
    DELETE FROM agent_run WHERE id = ANY (ARRAY(SELECT id FROM unmoved))
    RETURNING id, workspace, enqueue_key
),
purged AS (
    SELECT * FROM gone UNION ALL SELECT * FROM gone_unmoved
),
keys AS (
    DELETE FROM agent_run_key k USING purged
    WHERE purged.enqueue_key IS NOT NULL AND k.workspace = purged.workspace
      AND k.key = purged.enqueue_key AND k.run_id = purged.id
),
signals AS (
    DELETE FROM agent_run_signal s USING purged WHERE s.run_id = purged.id
)
SELECT id FROM purged
""")

# The read API (AgentRuns.list_runs): newest first, keyset-paged on the queue order. One text per
# set of filters given, so each runs on a generic plan of its own that never tests a parameter
# for NULL (ADRs/0011: every statement runs on its generic plan). The runs of each state are a
# branch of their own whose state is written out, so each branch reads its state's partial
# indexes in queue order and the first page of the three gives the page (ADRs/0018): the console's
# indexes are written only when a row enters their state, never by a renewal. The runs are read
# from agent_run_all: a queued or leased branch reads agent_run alone (the history's CHECK leaves
# it out), the ended branch merges the ended runs agent_run still has with the history's
# (ADRs/0035).
_LIST_FILTERS = {
    "workspace": "workspace = :workspace",
    "subject": "subject = :subject",
    "kind": "kind = :kind",
    "band": "band = :band",
    "reason": "end_reason = :reason",
    "enqueued_after": "enqueued_at >= :enqueued_after",
    "enqueued_before": "enqueued_at < :enqueued_before",
    "before_seq": "seq < :before_seq",
    "waiting": "waiting_until IS NOT NULL",
}
LIST_STATES = ("queued", "leased", "ended")
# The one end reason most runs end with; the others are few, and an index of their own finds
# them (a dead letter among a million completed runs).
_SUCCESS = "completed"


def list_runs(
    filters: Iterable[str], state: str | None = None, reason: str | None = None
) -> TextClause:
    """The listing statement for these filters (names of :class:`~agentruns.app.ports.RunQuery`
    fields that are set, besides ``state``), in the given ``state`` (else every state) and, for
    an end ``reason``, whether it is the common one; the same arguments give the same statement."""
    return _list_runs(frozenset(filters), state, None if reason is None else reason == _SUCCESS)


@cache
def _list_runs(filters: frozenset[str], state: str | None, success: bool | None) -> TextClause:
    unknown = filters - _LIST_FILTERS.keys()
    if unknown:
        raise ValueError(f"no run filter named {sorted(unknown)}")
    if state is not None and state not in LIST_STATES:
        raise ValueError(f"no run state {state!r}")
    where = [_LIST_FILTERS[name] for name in _LIST_FILTERS if name in filters]
    if success is not None:
        states = ["ended"] if state in (None, "ended") else []
        where.append("end_reason = 'completed'" if success else "end_reason <> 'completed'")
    else:
        states = list(LIST_STATES) if state is None else [state]
    branches = [
        f"SELECT {RUN_COLUMNS}, enqueue_key, waiting_for, waiting_until, waiting_since, result, "
        "input_tokens, output_tokens, cost FROM agent_run_all WHERE "
        + " AND ".join([f"state = '{name}'", *where])
        for name in states
    ] or [
        f"SELECT {RUN_COLUMNS}, enqueue_key, waiting_for, waiting_until, waiting_since, result, "
        "input_tokens, output_tokens, cost FROM agent_run_all WHERE false"
    ]
    if len(branches) == 1:
        return statement(f"{branches[0]}\nORDER BY seq DESC LIMIT :limit")
    # Each branch takes its own first page from its index, so the merge sorts three pages at
    # most, whatever the size of the table.
    union = "\n  UNION ALL\n  ".join(
        f"({branch} ORDER BY seq DESC LIMIT :limit)" for branch in branches
    )
    return statement(f"""
SELECT * FROM (
  {union}
) runs ORDER BY seq DESC LIMIT :limit
""")


# A watcher's row (ADRs/0030): inserted only for a run that exists, wherever it is (no row back:
# RunNotFound); its time is when it began, for an operator, not a decision.
WATCH = statement("""
INSERT INTO agent_run_watch (run_id, watcher, since)
SELECT id, :watcher, now() FROM agent_run_all WHERE id = :run_id
RETURNING run_id
""")

UNWATCH = statement("""
DELETE FROM agent_run_watch WHERE run_id = :run_id AND watcher = :watcher
""")

# The lane's count and the deltas not folded yet.
LEASED_COUNT = statement("""
SELECT COALESCE((SELECT leased FROM agent_workspace WHERE id = :workspace), 0)
     + COALESCE((SELECT sum(leased) FROM agent_workspace_delta WHERE workspace = :workspace), 0)
       AS leased
""")


def _effective_band(band: str, due_at: str) -> str:
    """The domain's effective band in SQL: a BACKGROUND run that waited ``aging`` since it was
    due orders as BATCH; nothing ages into INTERACTIVE, so one comparison is the whole rule."""
    return (
        f"CASE WHEN {band} = 2 AND clock.aging > interval '0' "
        f"AND {due_at} <= clock.now - clock.aging THEN 1 ELSE {band} END"
    )


# The claim (ADRs/0017) is the function ``agent_claim`` (ddl/claim.sql): it folds the lanes'
# ledger, ranks the heads of the first :limit lanes in claim order, leases the first
# :limit it can lock (SKIP LOCKED) and moves their lanes on. It reads about :limit lanes and a
# few heads per lane, whatever the number of workspaces, queued, leased or ended runs. :alone
# says the claim is its own transaction: then it waits for another such claim under way
# (ADRs/0038).
CLAIM = statement("""
SELECT * FROM agent_claim(
    CAST(:now AS timestamptz), CAST(:aging AS interval), :holder, :limit, CAST(:alone AS boolean))
""")

_CLAIMED = f"""
, claimed AS (
    UPDATE agent_run r SET state = 'leased', epoch = r.epoch + 1, head = true,
                           leased_until = clock.now + r.lease, holder = :holder,
                           claimed_at = clock.now, parked = false
    FROM picked, clock WHERE r.id = picked.id
    RETURNING {_R_COLUMNS}, picked.claim_band, picked.claim_load
)
SELECT * FROM claimed
"""

# A claim of some kinds: a worker's, of the kinds it can run. While the database has seen no
# kind outside them (agent_kind, written by every enqueue), the lane claim serves: it can lease
# no other kind. The registry's answer sets the lane claim's limit (0 when another kind was
# seen: the function returns at once, touching nothing; a filter on its rows would not keep a
# volatile function from running) and comes back on every row, the one row of NULLs included
# when nothing was claimed, so the store knows to take CLAIM_KINDS instead (ADRs/0021).
CLAIM_IF_KNOWN = statement("""
SELECT f.foreign_kinds, c.*
FROM (SELECT EXISTS (
        SELECT 1 FROM agent_kind k WHERE k.name <> ALL (CAST(:kinds AS text[]))
      ) AS foreign_kinds) f
LEFT JOIN LATERAL agent_claim(
    CAST(:now AS timestamptz), CAST(:aging AS interval), :holder,
    CASE WHEN f.foreign_kinds THEN 0 ELSE CAST(:limit AS integer) END, CAST(:alone AS boolean)
) c ON true
""")

# Otherwise the lanes' order cannot be trusted (a lane's first head may be of another kind), so
# the claim probes each open workspace's first offered head of those kinds per band, as the claim
# did before the lanes: its cost grows with the open workspaces. Exact against claim_order, like
# the lane claim.
CLAIM_KINDS = statement(f"""
WITH clock AS MATERIALIZED (SELECT {NOW} AS now, CAST(:aging AS interval) AS aging),
bands (band) AS (VALUES (CAST(0 AS smallint)), (CAST(1 AS smallint)), (CAST(2 AS smallint))),
open_ws AS MATERIALIZED (
    SELECT w.id, w.leased + COALESCE(
        (SELECT sum(d.leased) FROM agent_workspace_delta d WHERE d.workspace = w.id), 0) AS leased
    FROM agent_workspace w, clock
    WHERE w.active AND NOT EXISTS (
        SELECT 1 FROM agent_budget_hold h WHERE h.workspace = w.id AND h.until > clock.now)
),
heads AS (
    SELECT w.id AS workspace, w.leased, c.id, c.band, c.due_at, c.seq
    FROM open_ws w CROSS JOIN bands b CROSS JOIN clock
    CROSS JOIN LATERAL (
        SELECT x.id, x.band, x.due_at, x.seq FROM (
            (SELECT r.id, r.band, r.due_at, r.seq FROM agent_run r
             WHERE r.workspace = w.id AND r.band = b.band AND r.state = 'queued' AND r.head
               AND NOT r.parked AND r.due_at <= clock.now
               AND r.kind = ANY(CAST(:kinds AS text[]))
             ORDER BY r.due_at, r.seq LIMIT :limit)
            UNION ALL
            (SELECT o.run_id, o.band, o.due_at, o.seq FROM agent_subject_head o
             JOIN agent_run r ON r.id = o.run_id
             WHERE o.workspace = w.id AND o.band = b.band AND o.due_at <= clock.now
               AND r.kind = ANY(CAST(:kinds AS text[]))
             ORDER BY o.due_at, o.seq LIMIT :limit)) x
        ORDER BY x.due_at, x.seq LIMIT :limit) c
),
ranked AS (
    SELECT id, due_at, seq, {_effective_band("band", "due_at")} AS eb,
           leased + row_number() OVER (
               PARTITION BY workspace ORDER BY {_effective_band("band", "due_at")}, due_at, seq
           ) - 1 AS load
    FROM heads, clock
),
picked AS (
    SELECT r.id, k.eb AS claim_band, k.load AS claim_load
    FROM (SELECT * FROM ranked ORDER BY eb, load, due_at, seq LIMIT :pool) k
    JOIN agent_run r ON r.id = k.id
    WHERE r.state = 'queued' AND (r.head OR (
        SELECT o.run_id FROM agent_subject_head o
        WHERE o.workspace = r.workspace AND o.subject = r.subject) = r.id)
    ORDER BY k.eb, k.load, k.due_at, k.seq
    LIMIT :limit
    FOR UPDATE OF r SKIP LOCKED
){_CLAIMED}
""")

# claim_subject: the subject's head, flagged (one read through uq_agent_run_head) or named by the
# subject's row (its key: ADRs/0036).
CLAIM_SUBJECT = statement(f"""
WITH clock AS MATERIALIZED (SELECT {NOW} AS now, CAST(:aging AS interval) AS aging),
picked AS (
    SELECT r.id, {_effective_band("r.band", "r.due_at")} AS claim_band, 0 AS claim_load
    FROM (SELECT h.id FROM agent_run h
          WHERE h.workspace = :workspace AND h.subject = :subject AND h.head
          UNION ALL
          SELECT o.run_id FROM agent_subject_head o
          WHERE o.workspace = :workspace AND o.subject = :subject) s
    JOIN agent_run r ON r.id = s.id
    JOIN agent_workspace w ON w.id = r.workspace
    CROSS JOIN clock
    WHERE r.state = 'queued' AND r.due_at <= clock.now
      AND w.active AND {_KINDS.format(kind="r.kind")}
      AND NOT EXISTS (
          SELECT 1 FROM agent_budget_hold h WHERE h.workspace = w.id AND h.until > clock.now)
    LIMIT 1
    FOR UPDATE OF r SKIP LOCKED
){_CLAIMED}
""")

# An event's seq is the run's event count after it (``agent_run.events``), counted by the write
# that holds the run's row: appends of one run are serialised by that row's lock, so their seqs
# never collide and no append looks for the highest seq.
APPEND_EVENT = statement(f"""
WITH counted AS (
    UPDATE agent_run SET events = events + 1
    WHERE id = :run_id AND epoch = :epoch AND state = 'leased'
    RETURNING id, events, epoch
)
INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at)
SELECT counted.id, counted.events, counted.epoch, :type, :data, {NOW} FROM counted
RETURNING run_id, seq, epoch, type, data, created_at
""")

# A step boundary in one statement (ADRs/0007, ADRs/0011): the fenced renewal feeds the insert,
# so an event is appended only if the renewal held. The renewal locks the run and counts the
# event, which gives it its seq (see APPEND_EVENT).
RENEW_AND_APPEND = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
renewed AS (
    UPDATE agent_run SET leased_until = clock.now + lease, events = events + 1
    FROM clock WHERE {_FENCE}
    RETURNING {RUN_COLUMNS}, events AS event_count, clock.now AS renewed_at
),
appended AS (
    INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at)
    SELECT renewed.id, renewed.event_count, renewed.epoch, :type, :data, renewed.renewed_at
    FROM renewed
    RETURNING seq, type, data, created_at
)
SELECT renewed.*, appended.seq AS event_seq, appended.type AS event_type,
       appended.data AS event_data, appended.created_at AS event_created_at
FROM renewed LEFT JOIN appended ON true
""")


# A workspace's budget charged with a step's usage and its hold written once a limit is reached
# (ADRs/0033), as CTEs of the step boundary statements that carry usage: ``charged`` gives each
# workspace's tokens and cost of the statement and when. A workspace without a budget costs a
# primary key probe that finds nothing. The period rule restates
# agentruns.domain.budgets.period_bounds (a UTC day or month), held together by the contract
# suite; a new period starts the spend from this usage. The hold lasts until the period's end
# and never replaces a host's own hold (by_budget false). The budgets are locked in workspace
# order first, so two groups charging the same budgets never wait on each other in a cycle.
#
# A rolling budget (period 'rolling') keeps no running spend: ``window_rows`` sums its window's
# ledger rows (c.at - window < at <= c.at) through ix_agent_usage_workspace_at, with this
# statement's own charge (the ledger insert of this statement is not visible to its reads), and
# ``rolling`` restates agentruns.domain.budgets.rolling_hold_until: once the window's spend
# reaches a limit, the hold lasts until the earliest row's at + window whose ageing out (with
# every row no later than it) leaves the rest below every limit. The contract suite holds the
# two together. Day and month budgets and unbudgeted workspaces read no ledger row: the rolling
# CTEs start from ``locked`` filtered on the rolling period.
_BUDGET_START = "date_trunc(b.period, c.at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
_CHARGE_BUDGETS = f"""
locked AS (
    SELECT b.workspace, b.period, b.rolling_window, b.tokens, b.cost, b.hold_reason
    FROM agent_budget b
    WHERE b.workspace IN (SELECT workspace FROM charged)
    ORDER BY b.workspace
    FOR UPDATE
),
budgeted AS (
    UPDATE agent_budget b SET
        period_start = {_BUDGET_START},
        spent_tokens = c.tokens
            + CASE WHEN b.period_start = {_BUDGET_START} THEN b.spent_tokens ELSE 0 END,
        spent_cost = c.cost
            + CASE WHEN b.period_start = {_BUDGET_START} THEN b.spent_cost ELSE 0 END
    FROM charged c JOIN locked l ON l.workspace = c.workspace AND l.period <> 'rolling'
    WHERE b.workspace = c.workspace
    RETURNING b.workspace, b.tokens, b.cost, b.spent_tokens, b.spent_cost, b.hold_reason,
        (b.period_start AT TIME ZONE 'UTC' + CAST('1 ' || b.period AS interval))
            AT TIME ZONE 'UTC' AS period_end
),
window_rows AS (
    SELECT c.workspace, u.at,
           COALESCE(u.input_tokens, 0) + COALESCE(u.output_tokens, 0) AS tokens,
           COALESCE(u.cost, 0) AS cost
    FROM charged c JOIN locked l ON l.workspace = c.workspace AND l.period = 'rolling'
    JOIN agent_usage u ON u.workspace = c.workspace
        AND u.at > c.at - l.rolling_window AND u.at <= c.at
    UNION ALL
    SELECT c.workspace, c.at, c.tokens, c.cost
    FROM charged c JOIN locked l ON l.workspace = c.workspace AND l.period = 'rolling'
),
aged AS (
    SELECT workspace, at,
           sum(tokens) OVER whole AS spent_tokens, sum(cost) OVER whole AS spent_cost,
           sum(tokens) OVER whole - sum(tokens) OVER upto AS left_tokens,
           sum(cost) OVER whole - sum(cost) OVER upto AS left_cost
    FROM window_rows
    WINDOW whole AS (PARTITION BY workspace),
           upto AS (PARTITION BY workspace ORDER BY at)
),
rolling AS (
    SELECT a.workspace, l.hold_reason,
           min(a.at + l.rolling_window) FILTER (
               WHERE (l.tokens IS NULL OR a.left_tokens < l.tokens)
                 AND (l.cost IS NULL OR a.left_cost < l.cost)) AS until
    FROM aged a JOIN locked l ON l.workspace = a.workspace
    WHERE (l.tokens IS NOT NULL AND a.spent_tokens >= l.tokens)
       OR (l.cost IS NOT NULL AND a.spent_cost >= l.cost)
    GROUP BY a.workspace, l.hold_reason
),
held AS (
    INSERT INTO agent_budget_hold (workspace, until, reason, by_budget)
    SELECT workspace, period_end, hold_reason, true FROM budgeted
    WHERE (tokens IS NOT NULL AND spent_tokens >= tokens)
       OR (cost IS NOT NULL AND spent_cost >= cost)
    UNION ALL
    SELECT workspace, until, hold_reason, true FROM rolling
    ON CONFLICT (workspace) DO UPDATE SET until = EXCLUDED.until, reason = EXCLUDED.reason
    WHERE agent_budget_hold.by_budget
)"""

# A step boundary that reports usage (ADRs/0033): RENEW_AND_APPEND, whose fenced renewal also
# adds the step's usage to the run's totals, and whose append feeds the usage ledger's row at the
# event's seq, in the same statement: a refused fence renews, appends and records nothing. A step
# without usage runs RENEW_AND_APPEND itself, unchanged.
RENEW_AND_APPEND_USAGE = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
renewed AS (
    UPDATE agent_run SET leased_until = clock.now + lease, events = events + 1,
        input_tokens = input_tokens + COALESCE(CAST(:input_tokens AS bigint), 0),
        output_tokens = output_tokens + COALESCE(CAST(:output_tokens AS bigint), 0),
        cost = cost + COALESCE(CAST(:cost AS numeric), 0)
    FROM clock WHERE {_FENCE}
    RETURNING id, kind, workspace, epoch, events AS event_count, clock.now AS renewed_at
),
appended AS (
    INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at)
    SELECT renewed.id, renewed.event_count, renewed.epoch, :type, :data, renewed.renewed_at
    FROM renewed
    RETURNING seq, type, data, created_at
),
spent AS (
    INSERT INTO agent_usage (run_id, seq, workspace, kind, provider, model, at, input_tokens,
                             output_tokens, cost)
    SELECT renewed.id, renewed.event_count, renewed.workspace, renewed.kind,
           CAST(:provider AS text), CAST(:model AS text), renewed.renewed_at,
           CAST(:input_tokens AS bigint), CAST(:output_tokens AS bigint), CAST(:cost AS numeric)
    FROM renewed
),
charged AS (
    SELECT renewed.workspace, renewed.renewed_at AS at,
           COALESCE(CAST(:input_tokens AS bigint), 0)
               + COALESCE(CAST(:output_tokens AS bigint), 0) AS tokens,
           COALESCE(CAST(:cost AS numeric), 0) AS cost
    FROM renewed
),{_CHARGE_BUDGETS}
SELECT appended.seq AS event_seq, appended.type AS event_type,
       appended.data AS event_data, appended.created_at AS event_created_at
FROM renewed JOIN appended ON true
""")

# Group commit (ADRs/0011): one row per write, each guarded by its own fence; a row whose fence
# fails is simply not updated, so it neither blocks nor rolls back the others. The writes name
# distinct runs; ``ord`` gives each result back to its write. They come as one JSON array of
# ``[run id, workspace, epoch, ...]`` (one parameter: the client encodes one document instead of
# an array per field, ADRs/0019).
_GROUP = """
    SELECT CAST(e.v ->> 0 AS uuid) AS id, e.v ->> 1 AS workspace,
           CAST(e.v ->> 2 AS integer) AS epoch{extra}, e.ord
    FROM jsonb_array_elements(CAST(:writes AS jsonb)) WITH ORDINALITY AS e(v, ord)"""

_GROUP_FENCE = (
    "r.id = w.id AND r.workspace = w.workspace AND r.epoch = w.epoch AND r.state = 'leased' "
    "AND r.leased_until > clock.now"
)


def _end_many(returning: str) -> TextClause:
    """The ends of a group, each under its fence, answering ``returning`` of each ended run. A
    write's fifth element is its result (ADRs/0026): a write without one ends with none."""
    return statement(f"""
WITH clock AS (SELECT {NOW} AS now),
w AS ({_GROUP.format(extra=", e.v ->> 3 AS reason, e.v -> 4 AS result")}),
ended AS (
    UPDATE agent_run r SET state = 'ended', head = false, leased_until = NULL,
                           end_reason = w.reason, ended_at = clock.now, result = w.result
    FROM w, clock WHERE {_GROUP_FENCE}
    RETURNING {returning}
)
SELECT w.ord, ended.* FROM w LEFT JOIN ended ON ended.id = w.id ORDER BY w.ord
""")


END_MANY = _end_many(f"{_R_COLUMNS}, r.result")

# The same ends, answering only which were written: a holder that only needs to know its end
# held (the worker) does not pay for reading each ended run back and mapping it.
END_MANY_QUIET = _end_many("r.id")

# The step boundaries of a group: as RENEW_AND_APPEND, row by row. Each event is what its write
# said, at the run's next sequence number and the renewal's time: only those come back.
RENEW_AND_APPEND_MANY = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
w AS ({_GROUP.format(extra=", e.v ->> 3 AS type, e.v -> 4 AS data")}),
renewed AS (
    UPDATE agent_run r SET leased_until = clock.now + r.lease, events = r.events + 1
    FROM w, clock WHERE {_GROUP_FENCE}
    RETURNING r.id, r.epoch, r.events, clock.now AS renewed_at
),
appended AS (
    INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at)
    SELECT n.id, n.events, n.epoch, w.type, w.data, n.renewed_at
    FROM renewed n JOIN w ON w.id = n.id
)
SELECT w.ord, n.id IS NOT NULL AS renewed, n.events AS seq, n.renewed_at AS created_at
FROM w LEFT JOIN renewed n ON n.id = w.id
ORDER BY w.ord
""")

# The step boundaries of a group when some write reports usage (ADRs/0033): as
# RENEW_AND_APPEND_MANY, each write's usage (elements 5 to 9: input and output tokens, cost as
# text, provider, model; all null for a write without usage) added to its run's totals and, for a
# write that reported usage, recorded in the ledger at its event's seq, under its own fence. A
# group without usage runs RENEW_AND_APPEND_MANY itself, unchanged.
_SPENT_GROUP = _GROUP.format(
    extra=", e.v ->> 3 AS type, e.v -> 4 AS data, CAST(e.v ->> 5 AS bigint) AS input_tokens, "
    "CAST(e.v ->> 6 AS bigint) AS output_tokens, CAST(e.v ->> 7 AS numeric) AS cost, "
    "e.v ->> 8 AS provider, e.v ->> 9 AS model, jsonb_array_length(e.v) > 5 AS spent"
)

RENEW_AND_APPEND_MANY_USAGE = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
w AS ({_SPENT_GROUP}),
renewed AS (
    UPDATE agent_run r SET leased_until = clock.now + r.lease, events = r.events + 1,
        input_tokens = r.input_tokens + COALESCE(w.input_tokens, 0),
        output_tokens = r.output_tokens + COALESCE(w.output_tokens, 0),
        cost = r.cost + COALESCE(w.cost, 0)
    FROM w, clock WHERE {_GROUP_FENCE}
    RETURNING r.id, r.kind, r.workspace, r.epoch, r.events, clock.now AS renewed_at
),
appended AS (
    INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at)
    SELECT n.id, n.events, n.epoch, w.type, w.data, n.renewed_at
    FROM renewed n JOIN w ON w.id = n.id
),
spent AS (
    INSERT INTO agent_usage (run_id, seq, workspace, kind, provider, model, at, input_tokens,
                             output_tokens, cost)
    SELECT n.id, n.events, n.workspace, n.kind, w.provider, w.model, n.renewed_at,
           w.input_tokens, w.output_tokens, w.cost
    FROM renewed n JOIN w ON w.id = n.id
    WHERE w.spent
),
charged AS (
    SELECT n.workspace, max(n.renewed_at) AS at,
           sum(COALESCE(w.input_tokens, 0) + COALESCE(w.output_tokens, 0)) AS tokens,
           sum(COALESCE(w.cost, 0)) AS cost
    FROM renewed n JOIN w ON w.id = n.id
    WHERE w.spent
    GROUP BY n.workspace
),{_CHARGE_BUDGETS}
SELECT w.ord, n.id IS NOT NULL AS renewed, n.events AS seq, n.renewed_at AS created_at
FROM w LEFT JOIN renewed n ON n.id = w.id
ORDER BY w.ord
""")

# The heartbeats of a group (ADRs/0023): each lease pushed to now + its length under its own
# fence, nothing else written (no event, no read back); the ids renewed come back.
RENEW_MANY = statement(f"""
WITH clock AS (SELECT {NOW} AS now),
w AS ({_GROUP.format(extra="")}),
renewed AS (
    UPDATE agent_run r SET leased_until = clock.now + r.lease
    FROM w, clock WHERE {_GROUP_FENCE}
    RETURNING r.id
)
SELECT w.ord, n.id IS NOT NULL AS renewed FROM w LEFT JOIN renewed n ON n.id = w.id
ORDER BY w.ord
""")

LIST_EVENTS = statement("""
SELECT run_id, seq, epoch, type, data, created_at FROM agent_run_event
WHERE run_id = :run_id AND seq > :after_seq ORDER BY seq LIMIT :limit
""")

# A workspace's spend (ADRs/0033): its ledger rows in [since, until) through
# ix_agent_usage_workspace_at, grouped per UTC period (date_trunc in UTC restates
# agentruns.domain.usage.period_start; the contract suite holds the two together), kind, provider
# and model, ordered as the memory adapter orders them.
SPEND = statement("""
SELECT date_trunc(CAST(:per AS text), at, 'UTC') AS period, kind, provider, model,
       count(*) AS steps, COALESCE(sum(input_tokens), 0) AS input_tokens,
       COALESCE(sum(output_tokens), 0) AS output_tokens, COALESCE(sum(cost), 0) AS cost
FROM agent_usage
WHERE workspace = :workspace AND at >= :since AND at < :until
GROUP BY 1, 2, 3, 4
ORDER BY 1, kind COLLATE "C", provider COLLATE "C" NULLS FIRST, model COLLATE "C" NULLS FIRST
""")

# Every workspace's spend in [since, until) (the console's, ADRs/0033), through ix_agent_usage_at,
# ordered as agentruns.domain.usage.spend_by_workspace orders it.
SPEND_BY_WORKSPACE = statement("""
SELECT * FROM (
    SELECT workspace, count(*) AS steps, COALESCE(sum(input_tokens), 0) AS input_tokens,
           COALESCE(sum(output_tokens), 0) AS output_tokens, COALESCE(sum(cost), 0) AS cost
    FROM agent_usage
    WHERE at >= :since AND at < :until
    GROUP BY workspace
) s
ORDER BY cost DESC, input_tokens + output_tokens DESC, workspace COLLATE "C"
""")

# A rolling budget's window of a workspace's ledger (ADRs/0033): its rows at after < at <= upto
# through ix_agent_usage_workspace_at, oldest first (as the memory adapter orders them).
WINDOW_USAGE = statement("""
SELECT run_id, seq, kind, provider, model, at, input_tokens, output_tokens, cost
FROM agent_usage
WHERE workspace = :workspace AND at > :after AND at <= :upto
ORDER BY at, CAST(run_id AS text), seq
""")

SET_ACTIVE = statement("""
INSERT INTO agent_workspace (id, active) VALUES (:workspace, :active)
ON CONFLICT (id) DO UPDATE SET active = EXCLUDED.active
""")

HOLD_BUDGET = statement("""
INSERT INTO agent_budget_hold (workspace, until, reason) VALUES (:workspace, :until, :reason)
ON CONFLICT (workspace) DO UPDATE SET until = EXCLUDED.until, reason = EXCLUDED.reason,
                                      by_budget = false
""")

# A budget's own hold (ADRs/0033): never replaces a host's hold.
HOLD_SPENT_BUDGET = statement("""
INSERT INTO agent_budget_hold (workspace, until, reason, by_budget)
VALUES (:workspace, :until, :reason, true)
ON CONFLICT (workspace) DO UPDATE SET until = EXCLUDED.until, reason = EXCLUDED.reason
WHERE agent_budget_hold.by_budget
""")

LIFT_BUDGET_HOLD = statement(
    "DELETE FROM agent_budget_hold WHERE workspace = :workspace AND by_budget"
)

GET_BUDGET = statement("""
SELECT workspace, tokens, cost, period, rolling_window, period_start, spent_tokens, spent_cost
FROM agent_budget WHERE workspace = :workspace
""")

PUT_BUDGET = statement("""
INSERT INTO agent_budget (workspace, tokens, cost, period, rolling_window, period_start,
                          spent_tokens, spent_cost, hold_reason)
VALUES (:workspace, :tokens, :cost, :period, :rolling_window, :period_start, :spent_tokens,
        :spent_cost, :hold_reason)
ON CONFLICT (workspace) DO UPDATE SET tokens = EXCLUDED.tokens, cost = EXCLUDED.cost,
    period = EXCLUDED.period, rolling_window = EXCLUDED.rolling_window,
    period_start = EXCLUDED.period_start,
    spent_tokens = EXCLUDED.spent_tokens, spent_cost = EXCLUDED.spent_cost,
    hold_reason = EXCLUDED.hold_reason
""")

REMOVE_BUDGET = statement(
    "DELETE FROM agent_budget WHERE workspace = :workspace RETURNING workspace"
)

RELEASE_BUDGET = statement("DELETE FROM agent_budget_hold WHERE workspace = :workspace")

HOLDS = statement(f"""
SELECT workspace, until, reason, by_budget FROM agent_budget_hold WHERE until > {NOW}
ORDER BY workspace
""")
