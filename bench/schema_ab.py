"""``python -m bench.schema_ab``: the worker loop on two revisions of the schema, the same code.

    .venv/bin/python -m bench.schema_ab --before 0028_rolling_budgets [--after head]
        [--rounds 6] [--jobs 15000] [--runs-per-subject 4]

A schema lever (a trigger, a function, an index) changes no Python: its effect is the same
drain on a database migrated to the revision before it and on one migrated to it. Each round
drains ``--jobs`` runs with the worker loop (1,024 slots, ``bench.throughput``'s queue) once on
each side, each on a fresh database of the embedded server, the order alternating round by
round (``--runs-per-subject 1``: every run its subject's only one, so no end promotes a next
run), and reports per drain and as medians: runs/s, the whole machine's CPU per run, the bench
process's CPU per run, WAL records per run, and the server time of each of agentruns' functions
(``track_functions = 'all'``: self time, the statements inside a function included).

A profile to weigh one lever by, not a bench with a target: run it alone and say the load
average with its figures. Nothing is written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from dataclasses import dataclass
from urllib.parse import urlsplit

import psycopg

from bench.cpu_split import client_cpu, functions, machine, wal
from bench.server import BenchServer, bench_server
from bench.throughput import agentruns_runner
from bench.throughput.agentruns_runner import RUNS_PER_SUBJECT


@dataclass(frozen=True)
class Drain:
    rate: float
    cpu: float  # the whole machine's, µs per run
    client: float  # the bench process's, µs per run
    wal: float  # records per run
    functions: dict[str, float]  # µs per run, self time


async def drain(
    server: BenchServer, revision: str, jobs: int, runs_per_subject: int = RUNS_PER_SUBJECT
) -> Drain:
    url = server.create_database("schema-ab")
    try:
        await agentruns_runner.prepare(
            url, jobs, revision=revision, runs_per_subject=runs_per_subject
        )
        name = urlsplit(url).path.lstrip("/")
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'all'")
            await conn.execute("SELECT pg_stat_reset()")
        records, client, ticks = (await wal(url))[0], client_cpu(), machine()
        done, seconds = await agentruns_runner.drain_worker_loop(url, concurrency=1024)
        await asyncio.sleep(0.7)  # the statistics collector's flush
        records = (await wal(url))[0] - records
        client = client_cpu() - client
        total, idle = (now - then for now, then in zip(machine(), ticks, strict=True))
        busy = 1 - idle / max(total, 1)
        per = 1e6 / max(done, 1)
        return Drain(
            rate=done / seconds,
            cpu=busy * (os.cpu_count() or 1) * seconds * per,
            client=client * per,
            wal=records / max(done, 1),
            functions={func: ms * 1000 / max(done, 1) for func, _calls, ms in await functions(url)},
        )
    finally:
        server.drop_database(url)


def shown(side: str, drained: Drain) -> str:
    top = sorted(drained.functions.items(), key=lambda item: -item[1])[:5]
    return (
        f"{side}: {drained.rate:,.0f} runs/s; per run CPU {drained.cpu:.0f} us, bench process "
        f"{drained.client:.0f} us, WAL {drained.wal:.1f} records; "
        + ", ".join(f"{func} {us:.1f} us" for func, us in top)
    )


async def main_async(
    before: str, after: str, rounds: int, jobs: int, runs_per_subject: int = RUNS_PER_SUBJECT
) -> None:
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sides: dict[str, list[Drain]] = {before: [], after: []}
    with bench_server() as server:
        for round_ in range(rounds):
            order = (before, after) if round_ % 2 == 0 else (after, before)
            for side in order:
                drained = await drain(server, side, jobs, runs_per_subject)
                sides[side].append(drained)
                print(f"round {round_} {shown(side, drained)}", flush=True)
    for side, drains in sides.items():
        print(
            f"{side}: median {statistics.median(d.rate for d in drains):,.0f} runs/s, CPU "
            f"{statistics.median(d.cpu for d in drains):.0f} us, bench process "
            f"{statistics.median(d.client for d in drains):.0f} us, WAL "
            f"{statistics.median(d.wal for d in drains):.1f} records, functions "
            f"{statistics.median(sum(d.functions.values()) for d in drains):.1f} us per run"
        )
    ratio = statistics.median(d.rate for d in sides[after]) / statistics.median(
        d.rate for d in sides[before]
    )
    print(f"{after} vs {before}: {ratio:.2f}x the rate")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.schema_ab", description=__doc__)
    parser.add_argument("--before", required=True, help="the revision before the lever")
    parser.add_argument("--after", default="head", help="the revision with it (head)")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds (6)")
    parser.add_argument("--jobs", type=int, default=15_000, help="runs per drain (15,000)")
    parser.add_argument(
        "--runs-per-subject",
        type=int,
        default=RUNS_PER_SUBJECT,
        help=f"runs of each subject in the queue ({RUNS_PER_SUBJECT}, as benched)",
    )
    args = parser.parse_args(argv)
    asyncio.run(main_async(args.before, args.after, args.rounds, args.jobs, args.runs_per_subject))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
