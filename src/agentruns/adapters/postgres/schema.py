"""The tables as SQLAlchemy Core metadata: their columns and constraints, as the migrations build
them.

The rest of the schema (functions, triggers, indexes, the claim's type, table settings) is
written out as literal SQL in ``ddl/``, one file per concern. A test builds one database from
this metadata and those files and another from the migrations, and compares their catalogues
(``tests/postgres/test_schema_files.py``). Most rules of ``agent_run`` live in its guard trigger
(``ddl/guards.sql``), not in CHECK constraints, because the executor prepares a table's CHECK
expressions again for every statement (ADRs/0016).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Identity,
    Integer,
    Interval,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    Sequence,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

metadata = MetaData()

TZ = DateTime(timezone=True)

# A workspace's row is its lane (ADRs/0017): its leased runs and the first offered head of each
# band, indexed in claim order per band (ddl/lanes.sql). Claims keep it; everything else goes
# through the ledger agent_workspace_delta, which the next claim folds in.
agent_workspace = Table(
    "agent_workspace",
    metadata,
    Column("id", Text, primary_key=True),
    Column("active", Boolean, nullable=False, server_default=text("true")),
    Column("leased", Integer, nullable=False, server_default=text("0")),
    Column("h0_due", TZ),
    Column("h0_seq", BigInteger),
    Column("h1_due", TZ),
    Column("h1_seq", BigInteger),
    Column("h2_due", TZ),
    Column("h2_seq", BigInteger),
    CheckConstraint("leased >= 0", name="ck_agent_workspace_leased"),
)

# The ledger is keyed by workspace first (ADRs/0037): every claim reads it whole, grouped by
# workspace, and deletes a lane's rows by workspace, through this key. A table that takes and
# loses some 2.5 rows a run keeps the pages it grew to between vacuums, and a sequential scan
# read them all, three times a claim.
agent_workspace_delta = Table(
    "agent_workspace_delta",
    metadata,
    Column("id", BigInteger, nullable=False, autoincrement=True),
    Column("workspace", Text, nullable=False),
    Column("leased", Integer, nullable=False, server_default=text("0")),
    Column("bands", SmallInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("workspace", "id"),
)

# Every kind ever enqueued (the inserting statement's trigger adds it): a worker that knows them
# all claims through the lanes (ADRs/0021).
agent_kind = Table(
    "agent_kind",
    metadata,
    Column("name", Text, primary_key=True),
)

# One row per process that leases runs (a worker; a gateway for its sandboxes), written when it
# starts and about every `renewal` after, off the claim path, and marked stopped on a clean
# shutdown; the domain judges it live or gone (agentruns.domain.holders). Small and read whole.
agent_holder = Table(
    "agent_holder",
    metadata,
    Column("holder", Text, primary_key=True),
    Column("process", Text, nullable=False),
    Column("kinds", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    Column("renewal", Interval, nullable=False),
    Column("started_at", TZ, nullable=False),
    Column("seen_at", TZ, nullable=False),
    Column("stopped_at", TZ),
    CheckConstraint("renewal > interval '0'", name="ck_agent_holder_renewal"),
    CheckConstraint("seen_at >= started_at", name="ck_agent_holder_seen"),
)

# A provider limit (ADRs/0032): its definition, the bursts and rates the domain derives from it,
# and its two token buckets as of level_at; paused_until is a provider's Retry-After. One row per
# limit, written by one atomic UPDATE per take (adapters/postgres/limit_sql.py).
agent_limit = Table(
    "agent_limit",
    metadata,
    Column("name", Text, primary_key=True),
    Column("requests", BigInteger),
    Column("tokens", BigInteger),
    Column("per_seconds", Double, nullable=False),
    Column("requests_burst", Double, nullable=False),
    Column("requests_rate", Double, nullable=False),
    Column("tokens_burst", Double, nullable=False),
    Column("tokens_rate", Double, nullable=False),
    Column("requests_level", Double, nullable=False),
    Column("tokens_level", Double, nullable=False),
    Column("level_at", TZ, nullable=False),
    Column("paused_until", TZ),
    CheckConstraint("requests IS NOT NULL OR tokens IS NOT NULL", name="ck_agent_limit_some"),
    CheckConstraint("per_seconds > 0", name="ck_agent_limit_per"),
)

agent_budget_hold = Table(
    "agent_budget_hold",
    metadata,
    Column("workspace", Text, primary_key=True),
    Column("until", TZ, nullable=False),
    Column("reason", Text, nullable=False, server_default=text("''")),
    # Written by the workspace's budget (agent_budget) when its period's spend reached a limit;
    # raising or removing the budget lifts only such a hold, never a host's own (ADRs/0033).
    Column("by_budget", Boolean, nullable=False, server_default=text("false")),
)

# A workspace's budget (ADRs/0033): its limits, its period (a UTC day or month, or 'rolling'
# with its ``rolling_window``), the current period's start and what was spent in it, charged by
# the step boundaries that report usage (a primary key probe, only in the statements that carry
# usage; a rolling budget sums its window's ledger rows instead, ADRs/0033 "Rolling windows").
# ``hold_reason`` is the text its hold says, written by the domain
# (agentruns.domain.budgets.hold_reason).
agent_budget = Table(
    "agent_budget",
    metadata,
    Column("workspace", Text, primary_key=True),
    Column("tokens", BigInteger),
    Column("cost", Numeric),
    Column("period", Text, nullable=False),
    Column("rolling_window", Interval),
    Column("period_start", TZ, nullable=False),
    Column("spent_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("spent_cost", Numeric, nullable=False, server_default=text("0")),
    Column("hold_reason", Text, nullable=False),
    CheckConstraint("period IN ('day', 'month', 'rolling')", name="ck_agent_budget_period"),
    CheckConstraint("tokens IS NOT NULL OR cost IS NOT NULL", name="ck_agent_budget_limit"),
    CheckConstraint(
        "(period = 'rolling') = (rolling_window IS NOT NULL)", name="ck_agent_budget_window"
    ),
)

agent_run_seq = Sequence("agent_run_seq", metadata=metadata)


def _run_columns(*, ended: bool) -> list[Column[Any]]:
    """A run's columns, one list for both its homes: ``agent_run`` while it is queued or leased
    (and until the reaper moves it once it ended), ``agent_run_history`` after (ADRs/0035). The
    history's ``seq`` is the run's own, copied, with no default."""
    return [
        Column("id", UUID(as_uuid=True), primary_key=True),
        Column("kind", Text, nullable=False),
        Column("workspace", Text, nullable=False),
        Column("subject", Text, nullable=False),
        Column("band", SmallInteger, nullable=False),
        Column("payload", JSONB, nullable=False),
        Column("state", Text, nullable=False),
        Column("epoch", Integer, nullable=False),
        Column("attempt", Integer, nullable=False),
        # Queue order; the sequence is owned by agent_run.seq (ddl/runs.sql).
        Column(
            "seq",
            BigInteger,
            server_default=None if ended else agent_run_seq.next_value(),
            nullable=False,
        ),
        Column("enqueued_at", TZ, nullable=False),
        Column("due_at", TZ, nullable=False),
        Column("lease", Interval, nullable=False),
        Column("deadline_at", TZ),
        Column("leased_until", TZ),
        Column("holder", Text),
        Column("end_reason", Text),
        Column("ended_at", TZ),
        Column("continues", UUID(as_uuid=True)),
        # The newest failure, the enqueuer's trace and the domain-row flag (ADRs/0014).
        Column("domain_row", Boolean, nullable=False, server_default=text("false")),
        Column("trace_context", JSONB),
        Column("last_error_type", Text),
        Column("last_error", Text),
        Column("last_failure_class", Text),
        Column("head", Boolean, nullable=False, server_default=text("false")),
        Column("claimed_at", TZ),
        Column("events", Integer, nullable=False, server_default=text("0")),
        # The enqueue key, written at enqueue only (guard_agent_run_frozen); agent_run_key says
        # which run a key names now (ADRs/0024).
        Column("enqueue_key", Text),
        # What a waiting run waits for (a signal's name; NULL for a sleep) and until when; set by a
        # wait's give-back, cleared by the signal's wake-up or the wait's resolution (ADRs/0025).
        Column("waiting_for", Text),
        Column("waiting_until", TZ),
        # When the wait began (kept by a resumed wait that parks again), cleared with the two above.
        Column("waiting_since", TZ),
        # The JSON value the run ended with (NULL: none), written by the holder's fenced end only
        # (guard_agent_run_result; ADRs/0026).
        Column("result", JSONB),
        # A wait or a sleep whose end has not passed (ADRs/0029): out of the claim's index until
        # the first claim after its end, or its signal's wake-up, offers it again. Never on a
        # leased run.
        Column("parked", Boolean, nullable=False, server_default=text("false")),
        # The totals of its steps' usage (ADRs/0033), added by the step boundaries that report
        # usage. Not indexed: the boundary's UPDATE stays a HOT update.
        Column("input_tokens", BigInteger, nullable=False, server_default=text("0")),
        Column("output_tokens", BigInteger, nullable=False, server_default=text("0")),
        Column("cost", Numeric, nullable=False, server_default=text("0")),
    ]


agent_run = Table(
    "agent_run",
    metadata,
    *_run_columns(ended=False),
    CheckConstraint("state IN ('queued', 'leased', 'ended')", name="ck_agent_run_state"),
    CheckConstraint("band BETWEEN 0 AND 2", name="ck_agent_run_band"),
    CheckConstraint("epoch >= 0 AND attempt >= 0", name="ck_agent_run_counts"),
    CheckConstraint("state <> 'leased' OR leased_until IS NOT NULL", name="ck_agent_run_lease"),
    CheckConstraint("(state = 'ended') = (end_reason IS NOT NULL)", name="ck_agent_run_end"),
    CheckConstraint(
        "(state <> 'leased' OR head) AND (state <> 'ended' OR NOT head)", name="ck_agent_run_head"
    ),
)

# The runs that ended, moved out of agent_run in batches by the reaper (ADRs/0035): the claim,
# the step boundaries and the ends never read this table or write its indexes (the console's
# ended-run indexes are here, ddl/history.sql). A run is in one table at a time: the move deletes
# it from agent_run and inserts it here in one statement, and agent_run_all reads both.
agent_run_history = Table(
    "agent_run_history",
    metadata,
    *_run_columns(ended=True),
    CheckConstraint(
        "state = 'ended' AND end_reason IS NOT NULL AND ended_at IS NOT NULL "
        "AND leased_until IS NULL AND NOT head",
        name="ck_agent_run_history_ended",
    ),
)


# A subject's head named on a narrow row (ADRs/0036): the run an end promoted, from its promotion
# until its claim flags it head on its own row and deletes this one (or until it ends). Its band,
# due time and queue order are the run's, copied so the claim reads promoted heads in claim order
# from this table's index (ddl/lanes.sql). Written only by agent_run's triggers.
agent_subject_head = Table(
    "agent_subject_head",
    metadata,
    Column("workspace", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("band", SmallInteger, nullable=False),
    Column("due_at", TZ, nullable=False),
    Column("seq", BigInteger, nullable=False),
    PrimaryKeyConstraint("workspace", "subject"),
)


# Each enqueue key of a workspace and the run it names now: an enqueue with a key takes the row
# (INSERT ... ON CONFLICT DO NOTHING) or finds it; a key past its run's retention moves to the new
# run under the row's lock; a purge deletes the rows of the runs it deletes (ADRs/0024). No key
# to agent_run: a foreign key's triggers would run on the worker loop's updates of agent_run.
agent_run_key = Table(
    "agent_run_key",
    metadata,
    Column("workspace", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), nullable=False),
    PrimaryKeyConstraint("workspace", "key"),
)


# The signals delivered to runs (ADRs/0025), once per (run, signal id); the k-th wait for a name
# takes the k-th signal of that name (by id). No foreign key to agent_run (its triggers would run
# on the worker loop's updates of agent_run): a purge deletes the signals of the runs it deletes.
agent_run_signal = Table(
    "agent_run_signal",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("name", Text, nullable=False),
    Column("signal_id", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("delivered_at", TZ, nullable=False),
    UniqueConstraint("run_id", "signal_id", name="uq_agent_run_signal_id"),
)


# An event's run is checked by the guard guard_agent_run_event_insert, not by a foreign key, and
# a deleted run's events go with it (agent_run_gone): ddl/events.sql.
agent_run_event = Table(
    "agent_run_event",
    metadata,
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("type", Text, nullable=False),
    Column("data", JSONB, nullable=False),
    Column("created_at", TZ, nullable=False),
    UniqueConstraint("run_id", "seq", name="uq_agent_run_event_seq"),
)

# The usage ledger (ADRs/0033): one row per step that reported usage, written by that step's
# boundary in the same statement, at the step event's seq. It outlives its run's purge (a
# workspace's spend is billed after its runs are gone): no foreign key, no delete with the run.
agent_usage = Table(
    "agent_usage",
    metadata,
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("workspace", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("provider", Text),
    Column("model", Text),
    Column("at", TZ, nullable=False),
    Column("input_tokens", BigInteger),
    Column("output_tokens", BigInteger),
    Column("cost", Numeric),
    PrimaryKeyConstraint("run_id", "seq"),
)

# One row per watcher of a run (ADRs/0030): while a run has one, its commits are announced on
# channel agent_run_watch (ddl/watch.sql). The watcher removes its row when it stops; a purged
# run's rows go with it. No foreign key: a run moves to agent_run_history when it ended, and its
# watchers, like its failures, stay with it (agent_run_gone, agent_run_history_gone).
agent_run_watch = Table(
    "agent_run_watch",
    metadata,
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("watcher", UUID(as_uuid=True), nullable=False),
    Column("since", TZ, nullable=False),
    PrimaryKeyConstraint("run_id", "watcher"),
)

# One row per failed attempt, kept for the run's life (ADRs/0014), in whichever table the run is
# (no foreign key: see agent_run_watch).
agent_run_failure = Table(
    "agent_run_failure",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("holder", Text),
    Column("error_type", Text, nullable=False),
    Column("message", Text, nullable=False),
    Column("failure_class", Text, nullable=False),
    Column("traceback", Text, nullable=False),
    Column("recorded_at", TZ, nullable=False),
    # The seconds a provider asked to wait (Retry-After), when it said (ADRs/0032).
    Column("retry_after", Double),
)

# A sandbox's row owns its claim (the trigger guard_agent_sandbox keeps the state table and the
# identity: ddl/sandboxes.sql).
agent_sandbox = Table(
    "agent_sandbox",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("kind", Text, nullable=False),
    Column("workspace", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("requested_at", TZ, nullable=False),
    Column("ready_at", TZ),
    Column("last_used_at", TZ),
    Column("shutdown_at", TZ, nullable=False),
    Column("claim_name", Text, nullable=False),
    Column("conversation", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint("state IN ('requested', 'ready', 'deleting')", name="ck_agent_sandbox_state"),
    CheckConstraint("state <> 'ready' OR ready_at IS NOT NULL", name="ck_agent_sandbox_ready"),
    # A sandbox's times keep their order.
    CheckConstraint("shutdown_at > requested_at", name="ck_agent_sandbox_shutdown"),
    CheckConstraint(
        "ready_at IS NULL OR (ready_at >= requested_at AND ready_at <= shutdown_at)",
        name="ck_agent_sandbox_ready_at",
    ),
    CheckConstraint(
        "last_used_at IS NULL OR (ready_at IS NOT NULL AND last_used_at >= ready_at "
        "AND last_used_at <= shutdown_at)",
        name="ck_agent_sandbox_last_used",
    ),
    UniqueConstraint("claim_name", name="uq_agent_sandbox_claim_name"),
)

# Schedules declared in code, synced on start (ADRs/0015). Exactly
# one of cron and every; a removed schedule keeps its row (removed_at) and its ticks.
agent_schedule = Table(
    "agent_schedule",
    metadata,
    Column("name", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("workspace", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("band", SmallInteger, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("cron", Text),
    Column("every", Interval),
    Column("timezone", Text, nullable=False),
    Column("catch_up", Text, nullable=False),
    Column("catch_up_limit", Integer, nullable=False),
    Column("grace", Interval, nullable=False),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    Column("next_tick_at", TZ),
    Column("last_tick_at", TZ),
    Column("last_run", UUID(as_uuid=True)),
    Column("created_at", TZ, nullable=False),
    Column("updated_at", TZ, nullable=False),
    Column("removed_at", TZ),
    CheckConstraint("(cron IS NULL) <> (every IS NULL)", name="ck_agent_schedule_timing"),
    CheckConstraint("catch_up IN ('latest', 'all', 'none')", name="ck_agent_schedule_catch_up"),
    CheckConstraint("band BETWEEN 0 AND 2", name="ck_agent_schedule_band"),
    CheckConstraint("catch_up_limit >= 1", name="ck_agent_schedule_catch_up_limit"),
)

# One row per claimed tick: its key is what makes a second replica's claim a no-op.
agent_schedule_tick = Table(
    "agent_schedule_tick",
    metadata,
    Column(
        "schedule",
        Text,
        ForeignKey("agent_schedule.name", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("tick_at", TZ, nullable=False),
    Column("run_id", UUID(as_uuid=True)),
    Column("enqueued_at", TZ, nullable=False),
    PrimaryKeyConstraint("schedule", "tick_at", name="pk_agent_schedule_tick"),
)
