"""``python -m bench.head_cost``: what an enqueue, a claim and an end cost on two revisions.

    .venv/bin/python -m bench.head_cost --before 0029_state_watched_per_statement [--after head]
        [--rounds 3] [--jobs 8000] [--cohort 256] [--runs-per-subject 4]

The throughput bench's queue (``--jobs`` runs, 50 workspaces, ``--runs-per-subject`` runs per
subject; 1 means no end ever promotes a next run) is enqueued through the triggers in statements
of 5,000 (timed), then drained on one connection by the two statements the worker loop sends for
a cohort and that a subject's head touches: the claim (``agent_claim``, ``--cohort`` at a time)
and the group of ends (``END_MANY``), no step in between (a step boundary writes nothing a head
reads). One client, nothing concurrent, so each statement's round trip is its server time plus a
constant: the figures the drain benches (``bench.schema_ab``, ``bench.cpu_split``) blur with
contention and the machine's load. Each round drains a fresh database at each revision, the
order alternating. Reported per run, as medians over the rounds: the enqueue's, the claim's and
the end's time, WAL records and bytes (the server's counters, flushed after each statement), and
the server time of each of agentruns' functions (``track_functions = 'all'``, self time).

A profile to weigh a change of the head's bookkeeping by, not a bench with a target: run it
alone and say the load average with its figures. Nothing is written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import dict_row

from agentruns.adapters.postgres import sql
from agentruns.adapters.postgres.database import bound
from agentruns.adapters.postgres.migrate import migrate
from bench.server import BenchServer, bench_server
from bench.throughput import agentruns_runner
from bench.throughput.agentruns_runner import RUNS_PER_SUBJECT

_WAL = "SELECT wal_records, wal_bytes FROM pg_stat_wal"


@dataclass
class Cost:
    """One drain's totals per statement kind: seconds, WAL records and bytes."""

    seconds: dict[str, float] = field(
        default_factory=lambda: {"enqueue": 0.0, "claim": 0.0, "end": 0.0}
    )
    records: dict[str, int] = field(default_factory=lambda: {"claim": 0, "end": 0})
    wal_bytes: dict[str, int] = field(default_factory=lambda: {"claim": 0, "end": 0})
    functions: dict[str, float] = field(default_factory=dict)
    runs: int = 0


def _wal(conn: psycopg.Connection[dict[str, Any]]) -> tuple[int, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(_WAL).fetchone()
    assert row is not None
    return int(row["wal_records"]), int(row["wal_bytes"])


def _timed(
    conn: psycopg.Connection[dict[str, Any]], cost: Cost, kind: str, query: str, values: Any
) -> list[dict[str, Any]]:
    conn.execute("SELECT pg_stat_force_next_flush()")
    records, written = _wal(conn)
    started = time.perf_counter()
    rows = conn.execute(query, values, prepare=True).fetchall()
    cost.seconds[kind] += time.perf_counter() - started
    conn.execute("SELECT pg_stat_force_next_flush()")  # this statement's WAL, flushed
    after_records, after_written = _wal(conn)
    cost.records[kind] += after_records - records
    cost.wal_bytes[kind] += after_written - written
    return rows


def drain(url: str, cohort: int) -> Cost:
    cost = Cost()
    claim, claim_values = bound(
        sql.CLAIM,
        {"now": None, "aging": "10 minutes", "holder": "cost", "limit": cohort, "alone": True},
    )
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")  # as the adapter's pool
        conn.execute("SELECT pg_stat_reset()")
        while True:
            taken = _timed(conn, cost, "claim", claim, claim_values)
            if not taken:
                break
            cost.runs += len(taken)
            ends = json.dumps(
                [[str(row["id"]), row["workspace"], row["epoch"], "completed"] for row in taken]
            )
            query, values = bound(sql.END_MANY, {"now": None, "writes": ends})
            _timed(conn, cost, "end", query, values)
        conn.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.7)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        cost.functions = {
            str(row["funcname"]): float(row["self_time"])
            for row in conn.execute("SELECT funcname, self_time FROM pg_stat_user_functions")
        }
    return cost


def fill(url: str, revision: str, jobs: int, runs_per_subject: int) -> float:
    """The throughput bench's queue, enqueued through the triggers in its statements of 5,000
    runs (as ``agentruns_runner.prepare`` fills it); the seconds the inserts took."""
    migrate(url, revision)
    subjects = max(1, jobs // runs_per_subject)
    seconds = 0.0
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, jobs + 1, agentruns_runner.CHUNK):
            started = time.perf_counter()
            conn.execute(
                agentruns_runner.POPULATE,
                {
                    "kind": agentruns_runner.KIND,
                    "workspaces": agentruns_runner.WORKSPACES,
                    "subjects": subjects,
                    "first": first,
                    "last": min(jobs, first + agentruns_runner.CHUNK - 1),
                },
            )
            seconds += time.perf_counter() - started
        conn.execute("VACUUM ANALYZE")
    return seconds


async def measure(
    server: BenchServer, revision: str, jobs: int, cohort: int, runs_per_subject: int
) -> Cost:
    url = server.create_database("head-cost")
    try:
        enqueued = await asyncio.to_thread(fill, url, revision, jobs, runs_per_subject)
        name = urlsplit(url).path.lstrip("/")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'all'")
        cost = await asyncio.to_thread(drain, url, cohort)
        assert cost.runs == jobs, f"drained {cost.runs} of {jobs}"
        cost.seconds["enqueue"] = enqueued
        return cost
    finally:
        server.drop_database(url)


def shown(side: str, cost: Cost) -> str:
    per = 1e6 / max(cost.runs, 1)
    top = sorted(cost.functions.items(), key=lambda item: -item[1])[:4]
    return (
        f"{side}: enqueue {cost.seconds['enqueue'] * per:.1f} us; "
        f"claim {cost.seconds['claim'] * per:.1f} us, "
        f"{cost.records['claim'] / cost.runs:.2f} WAL records, "
        f"{cost.wal_bytes['claim'] / cost.runs:.0f} B; "
        f"end {cost.seconds['end'] * per:.1f} us, {cost.records['end'] / cost.runs:.2f} records, "
        f"{cost.wal_bytes['end'] / cost.runs:.0f} B per run; "
        + ", ".join(f"{func} {ms * 1000 / cost.runs:.1f} us" for func, ms in top)
    )


async def main_async(
    before: str, after: str, rounds: int, jobs: int, cohort: int, runs_per_subject: int
) -> None:
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sides: dict[str, list[Cost]] = {before: [], after: []}
    with bench_server() as server:
        for round_ in range(rounds):
            order = (before, after) if round_ % 2 == 0 else (after, before)
            for side in order:
                cost = await measure(server, side, jobs, cohort, runs_per_subject)
                sides[side].append(cost)
                print(f"round {round_} {shown(side, cost)}", flush=True)

    def median(costs: list[Cost], figure: str, kind: str) -> float:
        return float(statistics.median(getattr(c, figure)[kind] / c.runs for c in costs))

    for side, costs in sides.items():
        print(
            f"{side}: median per run: "
            f"enqueue {median(costs, 'seconds', 'enqueue') * 1e6:.1f} us; "
            f"claim {median(costs, 'seconds', 'claim') * 1e6:.1f} us, "
            f"{median(costs, 'records', 'claim'):.2f} WAL records, "
            f"{median(costs, 'wal_bytes', 'claim'):.0f} B; "
            f"end {median(costs, 'seconds', 'end') * 1e6:.1f} us, "
            f"{median(costs, 'records', 'end'):.2f} records, "
            f"{median(costs, 'wal_bytes', 'end'):.0f} B"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.head_cost", description=__doc__)
    parser.add_argument("--before", required=True, help="the revision before the change")
    parser.add_argument("--after", default="head", help="the revision with it (head)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    parser.add_argument("--jobs", type=int, default=8_000, help="runs per drain (8,000)")
    parser.add_argument("--cohort", type=int, default=256, help="runs per claim (256)")
    parser.add_argument(
        "--runs-per-subject",
        type=int,
        default=RUNS_PER_SUBJECT,
        help=f"runs of each subject in the queue ({RUNS_PER_SUBJECT}, as benched)",
    )
    args = parser.parse_args(argv)
    asyncio.run(
        main_async(
            args.before, args.after, args.rounds, args.jobs, args.cohort, args.runs_per_subject
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
