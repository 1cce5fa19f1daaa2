"""``python -m bench.purge``: issue 22's retention row. Does a purge of 1,000,000 ended runs out
of 10,000,000 take at most 60 s, and does the claim's p99 while it runs stay within 2x its p99
without it?

One fresh database on the bench server:

- ``--runs`` ended runs (10,000,000), two events each in ``agent_run_event``, inserted set-based
  into ``agent_run_history``, where the reaper leaves ended runs (ADRs/0035), by ``INSERT ...
  SELECT generate_series`` with the user triggers of both tables off (as
  ``bench.population`` does), in statements of ``CHUNK`` runs, each its own transaction. Their
  end times rise with their queue order, as a table that has been in use for weeks holds them:
  the oldest ``--purged`` (1,000,000) ended 8 to 10 days ago, past the purge's retention of 7
  days (the CLI's default), the others in the last 6 days, so a day either side of the cutoff
  keeps the count exact however long the run takes.
- A live queue: ``--queued`` runs (100,000) over 1,000 workspaces, inserted through the runs
  table and its triggers (``bench.depth``'s fill), then ``VACUUM ANALYZE`` and a checkpoint.
- Single claims (``AgentRuns.claim`` of limit 1, each claimed run ended at once, untimed, as
  ``bench.depth`` times them): ``--claims`` (2,000) without a purge, then the same loop on its
  own pool while ``AgentRuns.purge(older_than=7 days)`` runs at its default batch (what
  ``agentruns runs purge`` calls) in a thread of its own with its own pool, until it returns.

Reported: the purge's wall time and runs per second, the runs it purged (asserted equal to
``--purged``), the events that went with them, claim p50 / p99 without and during the purge,
and both targets. A smaller run is judged against the time target scaled to its ``--purged``.
Before the timed purge, one batch of the purge's own statement is explained (generic plan, as
the adapter runs it; rolled back), and after it the last, empty, batch. ``--tiny`` (100,000 runs,
10,000 purged) checks that the bench runs; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg.sql

from agentruns.adapters.postgres import (
    close_postgres_stores,
    make_postgres_stores,
    migrate,
    sql as pg_sql,
)
from agentruns.adapters.postgres.database import bound
from agentruns.app.runs import AgentRuns
from agentruns.domain.termination import TerminationReason
from bench.depth import KIND, WORKSPACES, _pct, _runs, claim_latency, populate as populate_queue
from bench.results import table, write_section
from bench.server import BenchServer, bench_server

# The retention the CLI's `runs purge` defaults to, and AgentRuns.purge's default batch.
RETENTION = timedelta(days=7)
BATCH = 1000
# Ended runs per inserting statement (and transaction): the statement's RETURNING rows and its
# WAL stay bounded.
CHUNK = 1_000_000
EVENTS_PER_RUN = 2
# Subjects of the ended runs (a subject stays in one workspace, as the queue's do).
ENDED_SUBJECTS = 1_000_000
TARGET_SECONDS = 60.0
TARGET_RUNS = 1_000_000
TARGET_RATIO = 2.0
WARMUP_CLAIMS = 50

# Run g (1-based, in queue order) ends at `ended`; the first `purged` end 10 to 8 days before
# `t0`, the others 6 days before it to `t0`. Each run's two events are written just before its
# end, under its one epoch. They are where the reaper leaves ended runs, agent_run_history
# (ADRs/0035).
POPULATE_ENDED = """
WITH runs AS (
    INSERT INTO agent_run_history (id, kind, workspace, subject, band, payload, state, epoch,
                                   attempt, seq, enqueued_at, due_at, lease, end_reason,
                                   ended_at, head, claimed_at, events)
    SELECT gen_random_uuid(), %(kind)s, 'ws-' || ((g %% %(subjects)s) %% %(workspaces)s),
           'done-' || (g %% %(subjects)s), (g %% 3)::smallint, '{}'::jsonb, 'ended', 1, 1,
           nextval('agent_run_seq'), ended - interval '2 minutes', ended - interval '2 minutes',
           interval '1 hour',
           CASE WHEN g %% 50 = 0 THEN 'retries_exhausted' ELSE 'completed' END, ended, false,
           ended - interval '1 minute', %(events)s
    FROM (
        SELECT g, CASE
            WHEN g <= %(purged)s THEN
                %(t0)s - interval '8 days'
                - (%(purged)s - g) * (interval '2 days' / greatest(%(purged)s, 1))
            ELSE %(t0)s - interval '6 days'
                + (g - %(purged)s) * (interval '6 days' / greatest(%(kept)s, 1))
            END AS ended
        FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
    ) AS s
    ORDER BY g
    RETURNING id, ended_at
)
INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at)
SELECT runs.id, n, 1, 'step', jsonb_build_object('step', n),
       runs.ended_at - (%(events)s - n + 1) * interval '1 second'
FROM runs CROSS JOIN generate_series(1, %(events)s) AS n
"""

# The populated ended runs left (the claims' runs are on subjects of another name).
POPULATED_LEFT = "SELECT count(*) FROM agent_run_all WHERE subject LIKE 'done-%%'"

# Deletes committed on agent_run (the statistics are flushed at each transaction's end).
DELETED_SO_FAR = "SELECT n_tup_del FROM pg_stat_user_tables WHERE relname = 'agent_run'"
PROGRESS_S = 30.0

SIZES = """
SELECT c.relname, pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'r'
ORDER BY pg_total_relation_size(c.oid) DESC
LIMIT 3
"""


@dataclass(frozen=True)
class Sizes:
    runs: int  # ended runs populated
    purged: int  # of them past the retention
    queued: int
    claims: int  # timed baseline claims


@dataclass
class Measured:
    sizes: Sizes
    populate_s: float = 0.0
    queue_s: float = 0.0
    vacuum_s: float = 0.0
    database_bytes: int = 0
    relations: list[tuple[str, int]] = field(default_factory=list)
    purged: int = 0
    events_purged: int = 0
    purge_s: float = 0.0
    baseline: tuple[float, float] = (0.0, 0.0)  # p50, p99 ms
    during: list[float] = field(default_factory=list)  # every claim's ms during the purge
    plan_batch: str = ""
    plan_last: str = ""

    @property
    def during_p50_p99(self) -> tuple[float, float]:
        if not self.during:
            return math.nan, math.nan
        return statistics.median(self.during), _pct(self.during, 0.99)


async def _count(conn: psycopg.AsyncConnection[Any], query: str) -> int:
    cur = await conn.execute(query)
    row = await cur.fetchone()
    return 0 if row is None else int(row[0])


async def populate(url: str, sizes: Sizes, measured: Measured) -> None:
    """The ended runs and their events (triggers off), then the queue (triggers on)."""
    started = time.perf_counter()
    await asyncio.to_thread(migrate, url)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT now()")
        row = await cur.fetchone()
        assert row is not None
        t0: datetime = row[0]
        await conn.execute("ALTER TABLE agent_run_history DISABLE TRIGGER USER")
        await conn.execute("ALTER TABLE agent_run_event DISABLE TRIGGER USER")
        try:
            for first in range(1, sizes.runs + 1, CHUNK):
                last = min(sizes.runs, first + CHUNK - 1)
                chunk_started = time.perf_counter()
                await conn.execute(
                    POPULATE_ENDED,
                    {
                        "kind": KIND,
                        "subjects": min(ENDED_SUBJECTS, sizes.runs),
                        "workspaces": WORKSPACES,
                        "events": EVENTS_PER_RUN,
                        "purged": sizes.purged,
                        "kept": sizes.runs - sizes.purged,
                        "t0": t0,
                        "first": first,
                        "last": last,
                    },
                )
                print(
                    f"  ended runs {first:,}-{last:,} with their events: "
                    f"{time.perf_counter() - chunk_started:.1f}s",
                    flush=True,
                )
        finally:
            await conn.execute("ALTER TABLE agent_run_event ENABLE TRIGGER USER")
            await conn.execute("ALTER TABLE agent_run_history ENABLE TRIGGER USER")
    measured.populate_s = time.perf_counter() - started
    print(f"populated {sizes.runs:,} ended runs in {measured.populate_s:.1f}s", flush=True)
    # The queue through the runs table's triggers; bench.depth's fill ends with VACUUM ANALYZE.
    started = time.perf_counter()
    await populate_queue(url, sizes.queued, subjects=min(100_000, sizes.queued))
    measured.queue_s = time.perf_counter() - started
    print(f"queued {sizes.queued:,} runs and vacuumed in {measured.queue_s:.1f}s", flush=True)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        await conn.execute("CHECKPOINT")
        measured.vacuum_s = time.perf_counter() - started
        measured.database_bytes = await _count(conn, "SELECT pg_database_size(current_database())")
        cur = await conn.execute(SIZES)
        measured.relations = [(str(name), int(size)) for name, size in await cur.fetchall()]


async def explain(url: str, older_than: timedelta, *, rollback: bool) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of one batch of the adapter's purge statement, prepared and on
    its generic plan as the adapter runs it (ADRs/0011); in a transaction rolled back if
    ``rollback``."""
    query, _ = bound(pg_sql.PURGE, {"ended_before": None, "limit": BATCH})
    prepared = query.replace("%(ended_before)s", "$1").replace("%(limit)s", "$2")
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE purge_batch (timestamptz, bigint) AS {prepared}")
        cur = await conn.execute(
            psycopg.sql.SQL(
                "EXPLAIN (ANALYZE, BUFFERS) EXECUTE purge_batch(now() - {}, {})"
            ).format(psycopg.sql.Literal(older_than), psycopg.sql.Literal(BATCH))
        )
        plan = "\n".join(str(line[0]) for line in await cur.fetchall())
        await (conn.rollback() if rollback else conn.commit())
    return plan


def _purge_in_thread(url: str, older_than: timedelta) -> tuple[int, float]:
    """``AgentRuns.purge`` at its default batch, on a pool and an event loop of its own."""

    async def purge() -> tuple[int, float]:
        stores = make_postgres_stores(url, None, pool_size=2)
        try:
            runs = _runs(stores)
            started = time.perf_counter()
            deleted = await runs.purge(older_than)
            return deleted, time.perf_counter() - started
        finally:
            await close_postgres_stores(stores)

    return asyncio.run(purge())


async def claims_while(runs: AgentRuns, running: threading.Event) -> list[float]:
    """Single claims (each claimed run ended, untimed) while ``running`` is set; each claim's ms."""
    timings: list[float] = []
    while running.is_set():
        started = time.perf_counter()
        claimed = await runs.claim("purge-claimer", limit=1)
        elapsed = (time.perf_counter() - started) * 1000
        if running.is_set():
            timings.append(elapsed)
        for run in claimed:
            await runs.end(run.fence, TerminationReason.COMPLETED)
    return timings


async def progress(url: str, running: threading.Event) -> None:
    """Every ``PROGRESS_S`` while ``running``: the runs deleted so far (the statistics' count of
    committed deletes, which costs the server nothing to read)."""
    started = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while running.is_set():
            for _ in range(int(PROGRESS_S * 10)):
                if not running.is_set():
                    return
                await asyncio.sleep(0.1)
            deleted = await _count(conn, DELETED_SO_FAR)
            print(
                f"  purging: {deleted:,} runs deleted after {time.perf_counter() - started:.0f}s",
                flush=True,
            )


async def measure(server: BenchServer, sizes: Sizes) -> Measured:
    measured = Measured(sizes)
    url = server.create_database("purge")
    try:
        await populate(url, sizes, measured)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            events_before = await _count(conn, "SELECT count(*) FROM agent_run_event")
        measured.plan_batch = await explain(url, RETENTION, rollback=True)
        stores = make_postgres_stores(url, None, pool_size=2)
        try:
            runs = _runs(stores)
            await claim_latency(runs, WARMUP_CLAIMS, 1)
            measured.baseline = await claim_latency(runs, sizes.claims, 1)
            print(
                f"claims without a purge: p50 {measured.baseline[0]:.2f} ms, "
                f"p99 {measured.baseline[1]:.2f} ms ({sizes.claims:,} claims)",
                flush=True,
            )
            running = threading.Event()
            running.set()

            def purge() -> tuple[int, float]:
                try:
                    return _purge_in_thread(url, RETENTION)
                finally:
                    running.clear()

            claiming = asyncio.create_task(claims_while(runs, running))
            watching = asyncio.create_task(progress(url, running))
            measured.purged, measured.purge_s = await asyncio.to_thread(purge)
            measured.during = await claiming
            await watching
        finally:
            await close_postgres_stores(stores)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            events_after = await _count(conn, "SELECT count(*) FROM agent_run_event")
            populated_left = await _count(conn, POPULATED_LEFT)
        measured.plan_last = await explain(url, RETENTION, rollback=False)
    finally:
        server.drop_database(url)
    measured.events_purged = events_before - events_after
    if measured.purged != sizes.purged:
        raise AssertionError(f"the purge deleted {measured.purged:,} runs, not {sizes.purged:,}")
    if populated_left != sizes.runs - sizes.purged:
        raise AssertionError(
            f"{populated_left:,} populated runs are left, not {sizes.runs - sizes.purged:,}"
        )
    if measured.events_purged != EVENTS_PER_RUN * sizes.purged:
        raise AssertionError(
            f"{measured.events_purged:,} events went with {sizes.purged:,} runs, not "
            f"{EVENTS_PER_RUN * sizes.purged:,}"
        )
    return measured


def _load() -> str:
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def _plan_lines(plan: str) -> list[str]:
    """The plan's nodes (without their detail lines but the index conditions), its triggers and
    its times."""
    keep = ("->", "Index Cond", "Trigger", "Execution Time", "Planning Time")
    lines = plan.splitlines()
    return lines[:1] + [line for line in lines[1:] if any(word in line for word in keep)]


def render(
    measured: Measured, *, command: str, started: datetime, load_before: str,
    settings: dict[str, str], note: str,
) -> str:  # fmt: skip
    sizes = measured.sizes
    during_p50, during_p99 = measured.during_p50_p99
    base_p50, base_p99 = measured.baseline
    ratio = during_p99 / base_p99 if base_p99 else math.nan
    limit_s = TARGET_SECONDS * sizes.purged / TARGET_RUNS
    scaled = "" if sizes.purged == TARGET_RUNS else f" (judged scaled: ≤ {limit_s:,.1f} s)"
    time_met = "met" if measured.purge_s <= limit_s else "**missed**"
    ratio_met = "met" if ratio <= TARGET_RATIO else "**missed**"
    batches = math.ceil(sizes.purged / BATCH) + (sizes.purged % BATCH == 0)
    rows = [
        f"| purge of {sizes.purged:,} ended runs out of {sizes.runs:,} (`AgentRuns.purge`, "
        f"retention {RETENTION.days} d, batch {BATCH}) | ≤ 60 s for 1,000,000 of 10,000,000"
        f"{scaled} | **{measured.purge_s:.1f} s** ({measured.purged / measured.purge_s:,.0f} "
        f"runs/s, {measured.purge_s / batches * 1000:.1f} ms per batch of {batches:,}; "
        f"{measured.events_purged:,} events with them), {time_met} |",
        f"| claim p99 during the purge / without (single claims over {sizes.queued:,} queued "
        f"runs, {WORKSPACES:,} workspaces) | ≤ {TARGET_RATIO:g}x | **{ratio:.2f}x** "
        f"({during_p99:.2f} ms vs {base_p99:.2f} ms), {ratio_met} |",
        f"| claim p50 during the purge / without | - | {during_p50:.2f} ms vs "
        f"{base_p50:.2f} ms ({len(measured.during):,} claims during, {sizes.claims:,} "
        f"without) |",
    ]
    relations = ", ".join(f"{name} {size / 2**30:.2f} GiB" for name, size in measured.relations)
    lines = [
        table("## Purge (`python -m bench.purge`)", started, rows),
        "",
        f"`{command}`; load average before {load_before}. Population: {sizes.runs:,} ended "
        f"runs with {EVENTS_PER_RUN} events each in {measured.populate_s:.0f} s (statements "
        f"of {CHUNK:,} runs, triggers off), {sizes.queued:,} queued through the triggers and "
        f"VACUUM ANALYZE in {measured.queue_s:.0f} s; database "
        f"{measured.database_bytes / 2**30:.2f} GiB ({relations}).",
        "",
        "Server: " + ", ".join(f"{name} {value}" for name, value in settings.items()) + ".",
        "",
        "One batch of the purge statement before the purge (generic plan, rolled back):",
        "",
        "```",
        *_plan_lines(measured.plan_batch),
        "```",
        "",
        "The last batch (nothing left past the retention), after the purge:",
        "",
        "```",
        *_plan_lines(measured.plan_last),
        "```",
    ]
    if note:
        lines += ["", note]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.purge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=10_000_000, help="ended runs (10,000,000)")
    parser.add_argument("--purged", type=int, default=1_000_000, help="of them past retention")
    parser.add_argument("--queued", type=int, default=100_000, help="the live queue (100,000)")
    parser.add_argument("--claims", type=int, default=2_000, help="baseline claims (2,000)")
    parser.add_argument(
        "--tiny", action="store_true", help="100,000 runs, 10,000 purged: checks the bench runs"
    )
    parser.add_argument("--note", default="", help="a line to add to RESULTS.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.tiny:
        sizes = Sizes(100_000, 10_000, 10_000, 500)
    else:
        sizes = Sizes(args.runs, args.purged, args.queued, args.claims)
    if not 0 < sizes.purged <= sizes.runs:
        parser.error("--purged is between 1 and --runs")
    started = datetime.now(UTC)
    load_before = _load()
    with bench_server() as server:
        settings = server.settings()
        measured = asyncio.run(measure(server, sizes))
    shown = [arg for arg in (sys.argv[1:] if argv is None else argv) if arg != "--no-write"]
    command = shlex.join(["python", "-m", "bench.purge", *shown])
    print("\n".join(["", "plan of one batch:", measured.plan_batch, "", measured.plan_last, ""]))
    text = render(
        measured, command=command, started=started, load_before=load_before,
        settings=settings, note=args.note,
    )  # fmt: skip
    print(text)
    if not args.no_write:
        write_section("purge", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
