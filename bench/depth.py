"""``python -m bench.depth`` (``make depth``): does a claim cost the same with a deep queue?

For each queue size (1,000 / 100,000 / 1,000,000 runs; ``--quick``: 1,000 / 10,000 / 100,000)
a fresh database is filled by ``INSERT ... SELECT generate_series`` through the runs table and
its triggers: 1,000 workspaces, up to 100,000 subjects, mixed bands, most runs due (aged up to a
day) and a tenth due in the future; then some workspaces are given leased runs. Measured:

- claim latency p50 / p99 of single claims (``AgentRuns.claim``, each its own transaction; every
  claimed run is ended at once, untimed, so the queue keeps its shape), and of batch claims of 10;
- renewals per second sustained over 1,000 leased runs (8 concurrent renewers);
- the reaper's cost to take back 10,000 expired leases (``AgentRunReaper.tick`` until done);
- table and index sizes, scaled to a million runs.

Target: claim p50 at the largest size within 2x of p50 at 1,000.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores, migrate
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import TerminationReason
from bench.results import write_section
from bench.server import BenchServer, bench_server

KIND = "depth"
WORKSPACES = 1_000
SUBJECTS = 100_000
CHUNK = 100_000

POPULATE = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt,
                       enqueued_at, due_at, lease)
SELECT gen_random_uuid(), %(kind)s, 'ws-' || (i %% %(workspaces)s),
       'subject-' || (i %% %(subjects)s), (i %% 3)::smallint, '{}'::jsonb, 'queued', 0, 0,
       now() - interval '1 day',
       CASE WHEN %(future)s AND i %% 10 = 9 THEN now() + interval '1 hour'
            ELSE now() - (i %% 86400) * interval '1 second' END,
       interval '1 hour'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
ORDER BY i
"""


async def _noop(run: AgentRun) -> Any:
    yield StepEvent("step", {})


def _kinds() -> RunKinds:
    return RunKinds([RunKind(RunKindPolicy(name=KIND, lease=timedelta(hours=1)), _noop)])


async def populate(url: str, runs: int, subjects: int, *, future: bool = True) -> float:
    """Fill a fresh database; with ``future``, every tenth run is due only in an hour."""
    started = time.perf_counter()
    await asyncio.to_thread(migrate, url)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for first in range(1, runs + 1, CHUNK):
            last = min(runs, first + CHUNK - 1)
            await conn.execute(
                POPULATE,
                {
                    "kind": KIND,
                    "workspaces": WORKSPACES,
                    "subjects": subjects,
                    "first": first,
                    "last": last,
                    "future": future,
                },
            )
        await conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def claim_latency(runs: AgentRuns, claims: int, limit: int) -> tuple[float, float]:
    """p50 and p99 of ``claims`` claims of up to ``limit`` runs, in milliseconds."""
    timings: list[float] = []
    for _ in range(claims):
        started = time.perf_counter()
        claimed = await runs.claim("depth-claimer", limit=limit)
        timings.append((time.perf_counter() - started) * 1000)
        for run in claimed:
            await runs.end(run.fence, TerminationReason.COMPLETED)
    return statistics.median(timings), _pct(timings, 0.99)


async def renewal_rate(runs: AgentRuns, leased: list[AgentRun], seconds: float) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def renewer(share: list[AgentRun]) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            for run in share:
                await runs.renew(run.fence)
                done += 1
                if time.perf_counter() >= deadline:
                    return

    started = time.perf_counter()
    await asyncio.gather(*(renewer(leased[n::8]) for n in range(8)))
    return done / (time.perf_counter() - started)


async def lease(runs: AgentRuns, holder: str, count: int) -> list[AgentRun]:
    leased: list[AgentRun] = []
    while len(leased) < count:
        claimed = await runs.claim(holder, limit=min(100, count - len(leased)))
        if not claimed:
            break
        leased.extend(claimed)
    return leased


async def sizes(url: str) -> list[tuple[str, int]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            """
            SELECT c.relname, pg_relation_size(c.oid)
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')
              AND (c.relname LIKE 'agent_run%%' OR c.relname LIKE 'agent_subject%%'
                   OR c.relname LIKE 'ix_agent%%' OR c.relname LIKE 'uq_agent%%')
            ORDER BY pg_relation_size(c.oid) DESC
            """
        )
        return [(str(name), int(size)) for name, size in await cur.fetchall()]


async def measure_size(server: BenchServer, size: int, claims: int) -> dict[str, Any]:
    url = server.create_database("depth")
    subjects = min(SUBJECTS, size)
    try:
        load = await populate(url, size, subjects)
        stores = make_postgres_stores(url, None, pool_size=10)
        runs = AgentRuns(stores, _kinds(), random.Random(0))
        try:
            # Some workspaces already hold leased runs (the claim's fairness reads their load).
            busy = await lease(runs, "busy-holder", min(500, size // 10))
            p50, p99 = await claim_latency(runs, claims, 1)
            b50, b99 = await claim_latency(runs, max(10, claims // 10), 10)
            result: dict[str, Any] = {
                "size": size,
                "subjects": subjects,
                "load_s": load,
                "leased": len(busy),
                "claim_p50": p50,
                "claim_p99": p99,
                "batch_p50": b50,
                "batch_p99": b99,
                "claims": claims,
            }
        finally:
            await close_postgres_stores(stores)
        result["sizes"] = await sizes(url)
        return result
    finally:
        server.drop_database(url)


async def measure_renewals_and_reaper(server: BenchServer, expired: int) -> dict[str, float]:
    url = server.create_database("reaper")
    try:
        await populate(url, expired, expired, future=False)
        stores = make_postgres_stores(url, None, pool_size=10)
        kinds = _kinds()
        runs = AgentRuns(stores, kinds, random.Random(0))
        try:
            leased = await lease(runs, "renewing-holder", expired)
            rate = await renewal_rate(runs, leased[:1000], 5.0)
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(
                    "UPDATE agent_run SET leased_until = now() - interval '1 second' "
                    "WHERE state = 'leased'"
                )
            reaper = AgentRunReaper(stores, kinds, random.Random(0), batch=500)
            started = time.perf_counter()
            taken = 0
            while True:
                report = await reaper.tick()
                taken += report.taken_back
                if report.taken_back == 0 and report.lost_races == 0 and report.failed == 0:
                    break
            reap_seconds = time.perf_counter() - started
        finally:
            await close_postgres_stores(stores)
        return {
            "renewals_per_s": rate,
            "expired": float(len(leased)),
            "taken_back": float(taken),
            "reap_s": reap_seconds,
        }
    finally:
        server.drop_database(url)


def render(
    results: list[dict[str, Any]], reaper: dict[str, float], command: str, note: str, pg: str
) -> str:
    first, last = results[0], results[-1]
    ratio = last["claim_p50"] / first["claim_p50"] if first["claim_p50"] else 0.0
    lines = [
        "## Depth: claim cost against queue size",
        "",
        f"Command: `{command}` (via `make depth`), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {pg}.",
    ]
    if note:
        lines.append(f"Note: {note}")
    lines += [
        "",
        "| queued runs | subjects | leased before | load (s) | single claim p50 / p99 (ms) "
        "| batch-10 claim p50 / p99 (ms) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['size']:,} | {r['subjects']:,} | {r['leased']} | {r['load_s']:.1f} | "
            f"{r['claim_p50']:.2f} / {r['claim_p99']:.2f} | "
            f"{r['batch_p50']:.2f} / {r['batch_p99']:.2f} |"
        )
    met = "met" if ratio <= 2.0 else "**missed**"
    lines += [
        "",
        f"Claim p50 at {last['size']:,} / at {first['size']:,}: {ratio:.2f}x "
        f"(target at most 2x: {met}). {first['claims']} single claims per size, each its own "
        "transaction through `AgentRuns.claim`, the claimed run ended untimed after it.",
        "",
        f"Renewals: {reaper['renewals_per_s']:,.0f} per second sustained over 1,000 leased runs "
        "(8 concurrent renewers, `AgentRuns.renew`, one transaction each).",
        "",
        f"Reaper: {reaper['taken_back']:,.0f} of {reaper['expired']:,.0f} expired leases taken "
        f"back in {reaper['reap_s']:.1f} s "
        f"({reaper['taken_back'] / max(reaper['reap_s'], 1e-9):,.0f} per second, one replica, "
        "`AgentRunReaper.tick` with batch 500).",
        "",
        f"Sizes at {last['size']:,} runs, scaled to one million runs (`agent_subject` holds one "
        f"row per subject: {last['subjects']:,} here):",
        "",
        "| relation | MiB per million runs |",
        "| --- | ---: |",
    ]
    for name, size in last["sizes"]:
        lines.append(f"| {name} | {size / last['size'] * 1_000_000 / 2**20:,.1f} |")
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> int:
    sizes_to_run = (1_000, 10_000, 100_000) if args.quick else (1_000, 100_000, 1_000_000)
    with bench_server() as server:
        pg = f"PostgreSQL {server.settings()['server_version']}"
        results = []
        for size in sizes_to_run:
            result = await measure_size(server, size, args.claims)
            results.append(result)
            print(
                f"{size:>9,} runs: loaded in {result['load_s']:.1f}s; claim p50 "
                f"{result['claim_p50']:.2f} ms, p99 {result['claim_p99']:.2f} ms; batch-10 p50 "
                f"{result['batch_p50']:.2f} ms",
                flush=True,
            )
        reaper = await measure_renewals_and_reaper(server, 1_000 if args.quick else 10_000)
        print(
            f"renewals {reaper['renewals_per_s']:,.0f}/s; reaper took back "
            f"{reaper['taken_back']:,.0f} in {reaper['reap_s']:.1f}s",
            flush=True,
        )
    command = "python -m bench.depth" + (" --quick" if args.quick else "")
    text = render(results, reaper, command, args.note, pg)
    print(text)
    if not args.no_write:
        write_section("depth", text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.depth", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1k / 10k / 100k runs")
    parser.add_argument("--claims", type=int, default=200, help="timed claims per size")
    parser.add_argument("--note", default="", help="a line to add to RESULTS.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
