"""``python -m bench.cpu_split``: where a drained run's time goes, client against server.

    .venv/bin/python -m bench.cpu_split [--jobs 15000]

Drains the throughput bench's queue (one step per run, 50 workspaces) with the worker loop
(1,024 slots; alone, then with a reaper ticking every second beside it, which moves the ended runs
to ``agent_run_history`` as a replica's would: ADRs/0035), and the raw SQL queue with 8
connections and batches of 10, each on a fresh database of the embedded server, and reports
per drained run: wall time, the whole machine's CPU (``/proc/stat``), the bench process's share
of it, the WAL the server wrote (records and bytes), and the server time spent in each of
agentruns' PL/pgSQL functions (the claim and the triggers: ``track_functions = 'all'``; the
statements' own executor time is not in it).

A profile, not a bench with a target: run it alone, and say the load average with its figures.
For the client side, run it under ``py-spy record -o profile.svg -- python -m bench.cpu_split``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import psycopg

from bench.server import BenchServer, bench_server
from bench.throughput import agentruns_runner, raw


def machine() -> tuple[int, int]:
    """(all, idle) CPU ticks of the whole machine so far, from ``/proc/stat``."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]  # idle and iowait


def client_cpu() -> float:
    times = os.times()
    return times.user + times.system


async def functions(url: str) -> list[tuple[str, int, float]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await asyncio.sleep(0.7)  # the statistics collector's flush
        cur = await conn.execute(
            "SELECT funcname, calls, self_time FROM pg_stat_user_functions ORDER BY self_time DESC"
        )
        return [(str(name), int(calls), float(ms)) for name, calls, ms in await cur.fetchall()]


async def wal(url: str) -> tuple[int, int]:
    """WAL records written so far (the whole server's), and the WAL insert position, in bytes."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT (SELECT wal_records FROM pg_stat_wal), "
            "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


async def split(
    server: BenchServer,
    label: str,
    prepare: Callable[[str, int], Awaitable[None]],
    drain: Callable[[str], Awaitable[tuple[int, float]]],
    jobs: int,
) -> None:
    url = server.create_database("split")
    try:
        await prepare(url, jobs)
        name = urlsplit(url).path.lstrip("/")
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'all'")
            await conn.execute("SELECT pg_stat_reset()")
        records, position = await wal(url)
        before, ticks = client_cpu(), machine()
        done, seconds = await drain(url)
        await asyncio.sleep(0.7)  # the statistics collector's flush
        records, position = (
            now - then for now, then in zip(await wal(url), (records, position), strict=True)
        )
        client = client_cpu() - before
        total, idle = (now - then for now, then in zip(machine(), ticks, strict=True))
        busy = 1 - idle / max(total, 1)
        cores = os.cpu_count() or 1
        per = 1e6 / max(done, 1)
        cpu = busy * cores * seconds
        print(
            f"{label}: {done:,} runs in {seconds:.1f} s ({done / seconds:,.0f}/s); machine "
            f"{busy:.0%} busy; per run: wall {seconds * per:.0f} us, CPU {cpu * per:.0f} us, "
            f"of which the bench process {client * per:.0f} us (the rest: the server); "
            f"WAL {records / max(done, 1):.1f} records, {position / max(done, 1):,.0f} bytes"
        )
        for func, calls, ms in await functions(url):
            print(f"    {func:28} {calls:>8,} calls  {ms * 1000 / max(done, 1):7.1f} us/run (self)")
    finally:
        server.drop_database(url)


async def main_async(jobs: int) -> None:
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with bench_server() as server:
        await split(
            server,
            "agentruns worker loop, 1024 slots",
            agentruns_runner.prepare,
            lambda url: agentruns_runner.drain_worker_loop(url, concurrency=1024),
            jobs,
        )
        await split(
            server,
            "agentruns worker loop, 1024 slots, a reaper ticking every second beside it",
            agentruns_runner.prepare,
            lambda url: agentruns_runner.drain_worker_loop(url, concurrency=1024, reaper_every=1.0),
            jobs,
        )
        await split(
            server,
            "agentruns single claims, no step, 8 claimers x limit 1, one worker",
            lambda url, n: agentruns_runner.prepare(url, n, steps=0),
            lambda url: agentruns_runner.drain(url, claimers=8, batch=1, shared=True),
            jobs // 3,
        )
        await split(
            server,
            "raw SQL, 8 connections, batch 10",
            raw.prepare,
            lambda url: raw.drain(url, connections=8, batch=10),
            jobs,
        )
        await split(
            server,
            "raw SQL, 8 connections, batch 1",
            raw.prepare,
            lambda url: raw.drain(url, connections=8, batch=1),
            jobs // 3,
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_split", description=__doc__)
    parser.add_argument("--jobs", type=int, default=15_000, help="runs per drain (15,000)")
    asyncio.run(main_async(parser.parse_args(argv).jobs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
