"""``python -m bench.depth`` (``make depth``): does the claim, the drain, the take-back and the
renewal cost the same however deep the queue, however many workspaces and leased runs?

Every measure gets a fresh database, filled by ``INSERT ... SELECT generate_series`` through the
runs table and its triggers (which keep the subject heads and the workspace lanes the claim
reads), then ``VACUUM ANALYZE``: runs spread round-robin over the workspaces and subjects, mixed
bands, most due (aged up to a day), a tenth due only in an hour. Measured (``--quick`` sizes in
brackets), each against a target of issue 10:

- **queue axis**: 1,000 vs 1,000,000 queued runs [1,000 vs 100,000], 1,000 workspaces, up to
  100,000 subjects, some workspaces already holding leased runs: p50 / p99 of single claims
  (``AgentRuns.claim``, each its own transaction; every claimed run is ended at once, untimed,
  so the queue keeps its shape) and of batch claims of 10. Target: p50 ratio at most 1.5x.
- **workspace axis**: 100,000 queued runs [10,000] spread over 10 / 1,000 / 10,000 open
  workspaces; the same claims. Target: p50 at 10,000 workspaces within 2x of p50 at 10.
- **leased axis**: 100,000 queued runs [20,000] over 1,000 workspaces, with 100 vs 10,000 of
  them leased first by another holder (an hour's lease); single claims. Target: within 2x.
- **drain**: the worker loop of ``bench.throughput`` (``Worker.run``, 64 slots, one step per
  run, 50 workspaces; a reaper ticking every second beside it, as on a replica) draining
  10,000 vs 100,000 runs [2,000 vs 20,000]. Target: the larger drain's rate at least 0.8x the
  smaller's. With ``--million``, a 1,000,000-run drain too (5,000 with ``--tiny``), after the
  others; target (issue 22): its rate at least 0.8x the smallest drain's.
- **snapshot**: the same worker loop draining 20,000 runs [5,000], each drain on a fresh
  database, with and without another session holding a REPEATABLE READ transaction open (its
  snapshot taken by one read of the runs table) for the whole drain, three drains of each side
  alternating. Target (issue 22): the median rate with the snapshot held at least 0.7x without.
- **take-back**: 10,000 expired leases [1,000] taken back by two ``AgentRunReaper`` replicas
  ticking concurrently, and by one for comparison. Target: at most 3 s with two replicas.
- **renewals** over 10,000 leased runs [1,000]: step boundaries through the worker's group
  commit (one ``GroupSettler``, one task per run; each boundary renews the lease and persists an
  event), target at least 10,000 per second; and the one-run path (``AgentRuns.renew``, one
  transaction each, 8 concurrent renewers), reported beside it.
- table and index sizes at the largest queue, scaled to a million runs.

``--only queue,workspaces,...`` runs a subset; ``--tiny`` shrinks everything to check the bench
runs (its figures mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores, migrate
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.ports import Stores
from agentruns.app.reaper import AgentRunReaper, ReapReport
from agentruns.app.runs import AgentRuns
from agentruns.app.settler import GroupSettler
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import TerminationReason
from bench.depth_report import render
from bench.results import write_section
from bench.server import BenchServer, bench_server
from bench.throughput import agentruns_runner

KIND = "depth"
WORKSPACES = 1_000
SUBJECTS = 100_000
# Rows per inserting statement: each holds its runs' subject locks until it commits, and the
# server's lock table holds only some ten thousand (max_locks_per_transaction 64).
CHUNK = 5_000
RENEWERS = 8
# A reaper ticks beside each drain's worker loop, as on every replica, and so moves the ended runs
# out of agent_run as the drain goes (ADRs/0035).
REAPER_EVERY = 1.0
MEASURES = ("queue", "workspaces", "leased", "drain", "snapshot", "takeback", "renewals")

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

EXPIRE = "UPDATE agent_run SET leased_until = now() - interval '1 second' WHERE state = 'leased'"
EXPIRED_LEFT = "SELECT count(*) FROM agent_run WHERE state = 'leased' AND leased_until < now()"
# Whether the snapshot holder's transaction holds back the xmin horizon, as it must to count.
HOLDER_XMIN = "SELECT backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = %s"


@dataclass(frozen=True)
class Scale:
    """The sizes of one run: the default, ``--quick`` or ``--tiny``."""

    queues: tuple[int, int]  # queued runs: the baseline and the deep queue
    spread_queue: int  # queued runs of the workspace axis
    spreads: tuple[int, ...]  # open workspaces of the workspace axis
    leased_queue: int  # queued runs of the leased axis
    leased: tuple[int, int]  # runs leased before the leased axis's claims
    drains: tuple[int, int]  # runs per drain
    million: int  # runs of the drain ``--million`` adds
    snapshot_runs: int  # runs per drain of the snapshot measure
    snapshot_rounds: int  # drains of each side (held, not held) of the snapshot measure
    expired: int  # expired leases to take back
    renewing: int  # leased runs renewed
    claims: int  # timed single claims per point (a tenth as many batch claims)
    seconds: float  # how long each renewal measure runs


SCALES = {
    "default": Scale(
        (1_000, 1_000_000), 100_000, (10, 1_000, 10_000), 100_000, (100, 10_000),
        (10_000, 100_000), 1_000_000, 20_000, 3, 10_000, 10_000, 200, 5.0,
    ),
    "quick": Scale(
        # The leased axis needs 10,000 due runs to lease and some left to claim: 20,000.
        (1_000, 100_000), 10_000, (10, 1_000, 10_000), 20_000, (100, 10_000),
        (2_000, 20_000), 1_000_000, 5_000, 3, 1_000, 1_000, 200, 5.0,
    ),
    "tiny": Scale(
        (1_000, 5_000), 5_000, (10, 100, 1_000), 5_000, (100, 1_000),
        (500, 2_000), 5_000, 500, 1, 500, 500, 40, 1.0,
    ),
}  # fmt: skip


async def _noop(run: AgentRun) -> Any:
    yield StepEvent("step", {})


def _kinds() -> RunKinds:
    return RunKinds([RunKind(RunKindPolicy(name=KIND, lease=timedelta(hours=1)), _noop)])


def _runs(stores: Stores) -> AgentRuns:
    return AgentRuns(stores, _kinds(), random.Random(0))


async def populate(
    url: str, runs: int, *, workspaces: int = WORKSPACES, subjects: int = SUBJECTS,
    future: bool = True,
) -> float:  # fmt: skip
    """Fill a fresh database with ``runs`` queued runs over ``workspaces`` workspaces and up to
    ``subjects`` subjects; with ``future``, every tenth run is due only in an hour. Seconds."""
    started = time.perf_counter()
    await asyncio.to_thread(migrate, url)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for first in range(1, runs + 1, CHUNK):
            await conn.execute(
                POPULATE,
                {
                    "kind": KIND,
                    "workspaces": workspaces,
                    "subjects": min(subjects, runs),
                    "first": first,
                    "last": min(runs, first + CHUNK - 1),
                    "future": future,
                },
            )
        await conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def claim_latency(runs: AgentRuns, claims: int, limit: int) -> tuple[float, float]:
    """p50 and p99 of ``claims`` claims of up to ``limit`` runs, in milliseconds; each claimed
    run is ended, untimed, before the next claim."""
    timings: list[float] = []
    for _ in range(claims):
        started = time.perf_counter()
        claimed = await runs.claim("depth-claimer", limit=limit)
        timings.append((time.perf_counter() - started) * 1000)
        for run in claimed:
            await runs.end(run.fence, TerminationReason.COMPLETED)
    return statistics.median(timings), _pct(timings, 0.99)


async def lease(runs: AgentRuns, url: str, holder: str, count: int) -> list[AgentRun]:
    """Lease ``count`` runs to ``holder``, 100 per claim (fewer if fewer are due).

    No ANALYZE after: the fill's statistics still say no run is leased, the worst case for a
    planner, and the hot statements must not depend on them (the reaper's take-back once read
    every leased run per run it took back under such statistics)."""
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
              AND (c.relname LIKE 'agent_run%%' OR c.relname LIKE 'agent_workspace%%'
                   OR c.relname LIKE 'ix_agent%%' OR c.relname LIKE 'uq_agent%%')
            ORDER BY pg_relation_size(c.oid) DESC, c.relname
            """
        )
        return [(str(name), int(size)) for name, size in await cur.fetchall()]


@dataclass
class ClaimPoint:
    """Claim latencies on one queue: ``queued`` runs over ``workspaces``, ``leased`` held."""

    queued: int
    workspaces: int
    subjects: int
    leased: int
    load_s: float
    claims: int
    single: tuple[float, float]  # p50, p99 in ms
    batch: tuple[float, float] | None = None
    sizes: list[tuple[str, int]] = field(default_factory=list)


async def claim_point(
    server: BenchServer, scale: Scale, queued: int, *, workspaces: int = WORKSPACES,
    busy: int = 0, batch: bool = True, keep_sizes: bool = False,
) -> ClaimPoint:  # fmt: skip
    """One fresh database: fill, lease ``busy`` runs to another holder, then time claims."""
    url = server.create_database("depth")
    subjects = min(SUBJECTS, queued)
    try:
        load = await populate(url, queued, workspaces=workspaces, subjects=subjects)
        stores = make_postgres_stores(url, None, pool_size=4)
        runs = _runs(stores)
        try:
            held = await lease(runs, url, "busy-holder", busy)
            if len(held) != busy:
                raise RuntimeError(f"leased {len(held)} of {busy} runs before the claims")
            point = ClaimPoint(
                queued, workspaces, subjects, len(held), load, scale.claims,
                await claim_latency(runs, scale.claims, 1),
            )  # fmt: skip
            if batch:
                point.batch = await claim_latency(runs, max(10, scale.claims // 10), 10)
        finally:
            await close_postgres_stores(stores)
        if keep_sizes:
            point.sizes = await sizes(url)
        return point
    finally:
        server.drop_database(url)


def _said(point: ClaimPoint, what: str) -> None:
    batch = "" if point.batch is None else f"; batch-10 p50 {point.batch[0]:.2f} ms"
    print(
        f"{what}: {point.queued:,} queued, {point.workspaces:,} workspaces, {point.leased:,} "
        f"leased (loaded in {point.load_s:.1f}s): claim p50 {point.single[0]:.2f} ms, p99 "
        f"{point.single[1]:.2f} ms{batch}",
        flush=True,
    )


async def queue_axis(server: BenchServer, scale: Scale) -> list[ClaimPoint]:
    points = []
    for queued in scale.queues:
        # Some workspaces already hold leased runs: the claim's fairness reads their load.
        busy = min(500, queued // 10)
        point = await claim_point(
            server, scale, queued, busy=busy, keep_sizes=queued == scale.queues[-1]
        )
        _said(point, "queue axis")
        points.append(point)
    return points


async def workspace_axis(server: BenchServer, scale: Scale) -> list[ClaimPoint]:
    points = []
    for workspaces in scale.spreads:
        point = await claim_point(server, scale, scale.spread_queue, workspaces=workspaces)
        _said(point, "workspace axis")
        points.append(point)
    return points


async def leased_axis(server: BenchServer, scale: Scale) -> list[ClaimPoint]:
    points = []
    for busy in scale.leased:
        point = await claim_point(server, scale, scale.leased_queue, busy=busy, batch=False)
        _said(point, "leased axis")
        points.append(point)
    return points


@dataclass(frozen=True)
class Drain:
    runs: int
    seconds: float
    prepare_s: float  # filling its queue, untimed by the drain

    @property
    def rate(self) -> float:
        return self.runs / self.seconds


async def drain(server: BenchServer, jobs: int) -> Drain:
    """One worker loop drain of ``jobs`` runs on a fresh database."""
    url = server.create_database("drain")
    try:
        started = time.perf_counter()
        await agentruns_runner.prepare(url, jobs)
        prepared = time.perf_counter() - started
        done, seconds = await agentruns_runner.drain_worker_loop(
            url, concurrency=64, reaper_every=REAPER_EVERY
        )
    finally:
        server.drop_database(url)
    if done != jobs:
        raise RuntimeError(f"the worker loop drained {done} of {jobs} runs")
    found = Drain(done, seconds, prepared)
    print(
        f"drain: {jobs:,} runs (prepared in {prepared:.1f}s) in {seconds:.1f}s, "
        f"{found.rate:,.0f} runs/s",
        flush=True,
    )
    return found


async def drains(server: BenchServer, scale: Scale) -> list[Drain]:
    return [await drain(server, jobs) for jobs in scale.drains]


@dataclass
class SnapshotDrains:
    """The worker loop's drain rates (runs/s) with another session's REPEATABLE READ snapshot
    held open for the whole drain, and without, drains of the two sides alternating."""

    runs: int
    held: list[float] = field(default_factory=list)
    without: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        base = statistics.median(self.without)
        return statistics.median(self.held) / base if base else 0.0


async def snapshot_drain(server: BenchServer, runs: int, *, held: bool) -> float:
    """One drain of ``runs`` on a fresh database, prepared as ``drains`` prepares, with (``held``)
    or without another session holding a REPEATABLE READ snapshot from before the drain starts
    until it ends; runs/s."""
    url = server.create_database("snapshot")
    try:
        await agentruns_runner.prepare(url, runs)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as holder:
            if held:
                # The snapshot is taken by the transaction's first read, after the prepare's
                # VACUUM: no dead tuple the drain leaves can be pruned or vacuumed until it ends.
                await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                await holder.execute("SELECT 1 FROM agent_run LIMIT 1")
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as probe:
                    cur = await probe.execute(HOLDER_XMIN, [holder.info.backend_pid])
                    row = await cur.fetchone()
                if row is None or not row[0]:
                    raise RuntimeError("the snapshot holder's transaction holds no xmin")
            done, seconds = await agentruns_runner.drain_worker_loop(
                url, concurrency=64, reaper_every=REAPER_EVERY
            )
            if held:
                await holder.execute("ROLLBACK")
    finally:
        server.drop_database(url)
    if done != runs:
        raise RuntimeError(f"the worker loop drained {done} of {runs} runs")
    return done / seconds


async def snapshot(server: BenchServer, scale: Scale) -> SnapshotDrains:
    found = SnapshotDrains(scale.snapshot_runs)
    for round_ in range(scale.snapshot_rounds):
        for held in (False, True):
            rate = await snapshot_drain(server, scale.snapshot_runs, held=held)
            (found.held if held else found.without).append(rate)
            side = "snapshot held" if held else "no snapshot  "
            print(
                f"snapshot: round {round_ + 1}, {side}: {scale.snapshot_runs:,} runs, "
                f"{rate:,.0f} runs/s",
                flush=True,
            )
    return found


@dataclass(frozen=True)
class TakeBack:
    replicas: int
    batch: int
    expired: int
    taken_back: int
    seconds: float
    ticks: int
    lost_races: int
    failed: int

    @property
    def rate(self) -> float:
        return self.taken_back / max(self.seconds, 1e-9)


async def take_back(server: BenchServer, scale: Scale, replicas: int, batch: int) -> TakeBack:
    """Lease ``scale.expired`` runs, expire their leases, and time ``replicas`` reapers ticking
    concurrently until no expired lease is left in the database."""
    url = server.create_database("reaper")
    try:
        await populate(url, scale.expired, subjects=scale.expired, future=False)
        stores = make_postgres_stores(url, None, pool_size=replicas + 4)
        try:
            leased = await lease(_runs(stores), url, "lost-holder", scale.expired)
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as probe:
                await probe.execute(EXPIRE)
                reports: list[ReapReport] = []
                reapers = [
                    AgentRunReaper(stores, _kinds(), random.Random(n), batch=batch)
                    for n in range(replicas)
                ]

                async def replica(reaper: AgentRunReaper) -> None:
                    # A replica that finds nothing may only see rows the other holds locked:
                    # it stops once the database has no expired lease left.
                    while True:
                        report = await reaper.tick()
                        reports.append(report)
                        if report.taken_back or report.lost_races or report.failed:
                            continue
                        if await _count(probe, EXPIRED_LEFT) == 0:
                            return
                        await asyncio.sleep(0.005)

                started = time.perf_counter()
                async with asyncio.timeout(600):
                    await asyncio.gather(*(replica(reaper) for reaper in reapers))
                seconds = time.perf_counter() - started
        finally:
            await close_postgres_stores(stores)
    finally:
        server.drop_database(url)
    result = TakeBack(
        replicas, batch, len(leased), sum(r.taken_back for r in reports), seconds, len(reports),
        sum(r.lost_races for r in reports), sum(r.failed for r in reports),
    )  # fmt: skip
    print(
        f"take-back: {result.taken_back:,} of {result.expired:,} expired leases by {replicas} "
        f"replica(s), batch {batch}, in {seconds:.2f}s ({result.rate:,.0f}/s)",
        flush=True,
    )
    return result


async def _count(conn: psycopg.AsyncConnection[Any], query: str) -> int:
    cur = await conn.execute(query)
    row = await cur.fetchone()
    return 0 if row is None else int(row[0])


@dataclass(frozen=True)
class Renewals:
    leased: int
    group_per_s: float
    group_done: int
    one_run_per_s: float
    max_group: int | None  # None: the worker's default
    renewers: int = RENEWERS


async def group_renewals(
    runs: AgentRuns, leased: list[AgentRun], seconds: float, max_group: int | None = None
) -> int:
    """Step boundaries through one ``GroupSettler`` (the worker's group commit, its groups of
    ``max_group`` or the worker's default), one task per leased run, for ``seconds``; how many
    were written."""
    settler = GroupSettler(runs) if max_group is None else GroupSettler(runs, max_group=max_group)
    deadline = time.perf_counter() + seconds
    done = 0

    async def steps(run: AgentRun) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await settler.step_boundary(run.fence, "step", {})
            done += 1

    await asyncio.gather(*(steps(run) for run in leased))
    return done


async def one_run_renewals(runs: AgentRuns, leased: list[AgentRun], seconds: float) -> int:
    """``AgentRuns.renew``, one transaction each, ``RENEWERS`` concurrent renewers."""
    deadline = time.perf_counter() + seconds
    done = 0

    async def renewer(share: list[AgentRun]) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            for run in share:
                await runs.renew(run.fence)
                done += 1
                if time.perf_counter() >= deadline:
                    return

    await asyncio.gather(*(renewer(leased[n::RENEWERS]) for n in range(RENEWERS)))
    return done


async def renewals(server: BenchServer, scale: Scale, max_group: int | None) -> Renewals:
    url = server.create_database("renew")
    try:
        await populate(url, scale.renewing, subjects=scale.renewing, future=False)
        # The group settler holds one connection; the one-run path one per renewer.
        stores = make_postgres_stores(url, None, pool_size=RENEWERS + 2)
        runs = _runs(stores)
        try:
            leased = await lease(runs, url, "renewing-holder", scale.renewing)
            started = time.perf_counter()
            group = await group_renewals(runs, leased, scale.seconds, max_group)
            group_rate = group / (time.perf_counter() - started)
            started = time.perf_counter()
            one_run = await one_run_renewals(runs, leased, scale.seconds)
            one_run_rate = one_run / (time.perf_counter() - started)
        finally:
            await close_postgres_stores(stores)
    finally:
        server.drop_database(url)
    print(
        f"renewals over {len(leased):,} leased runs: {group_rate:,.0f}/s through the group "
        f"commit, {one_run_rate:,.0f}/s one run at a time",
        flush=True,
    )
    return Renewals(len(leased), group_rate, group, one_run_rate, max_group)


@dataclass
class Results:
    """What one run measured (a measure not run stays empty)."""

    scale: Scale
    queue: list[ClaimPoint] = field(default_factory=list)
    workspaces: list[ClaimPoint] = field(default_factory=list)
    leased: list[ClaimPoint] = field(default_factory=list)
    drains: list[Drain] = field(default_factory=list)
    million: Drain | None = None  # with ``--million``
    snapshot: SnapshotDrains | None = None
    take_backs: list[TakeBack] = field(default_factory=list)
    renewals: Renewals | None = None


async def measure(
    server: BenchServer, scale: Scale, only: set[str], batch: int, max_group: int | None,
    million: bool = False,
) -> Results:  # fmt: skip
    results = Results(scale)
    if "queue" in only:
        results.queue = await queue_axis(server, scale)
    if "workspaces" in only:
        results.workspaces = await workspace_axis(server, scale)
    if "leased" in only:
        results.leased = await leased_axis(server, scale)
    if "drain" in only:
        results.drains = await drains(server, scale)
        if million:
            results.million = await drain(server, scale.million)
    if "snapshot" in only:
        results.snapshot = await snapshot(server, scale)
    if "takeback" in only:
        results.take_backs = [await take_back(server, scale, n, batch) for n in (2, 1)]
    if "renewals" in only:
        results.renewals = await renewals(server, scale, max_group)
    return results


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def _only(text: str) -> set[str]:
    chosen = {name.strip() for name in text.split(",") if name.strip()}
    unknown = chosen - set(MEASURES)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown measure(s) {', '.join(sorted(unknown))}; choose from {', '.join(MEASURES)}"
        )
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.depth",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes (a few minutes)")
    size.add_argument("--tiny", action="store_true", help="check the bench runs (seconds)")
    parser.add_argument(
        "--only", type=_only, action="append", help=f"comma-separated, of: {','.join(MEASURES)}"
    )
    parser.add_argument(
        "--million",
        action="store_true",
        help="add a 1,000,000-run drain to the drain measure (5,000 with --tiny; ~10 min)",
    )
    parser.add_argument("--claims", type=int, help="timed single claims per point (200)")
    parser.add_argument("--reap-batch", type=int, default=500, help="the reaper's batch (500)")
    parser.add_argument(
        "--max-group", type=int, help="the group commit's largest group (the worker's default)"
    )
    parser.add_argument("--note", default="", help="a line to add to RESULTS.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    name = "tiny" if args.tiny else "quick" if args.quick else "default"
    scale = SCALES[name]
    if args.claims:
        scale = replace(scale, claims=args.claims)
    only = set().union(*args.only) if args.only else set(MEASURES)
    if args.million and "drain" not in only:
        parser.error("--million adds to the drain measure: include drain in --only")
    started = datetime.now(UTC)
    load_before = _load()
    with bench_server() as server:
        version = f"PostgreSQL {server.settings()['server_version']}"
        results = asyncio.run(
            measure(server, scale, only, args.reap_batch, args.max_group, args.million)
        )
    finished = datetime.now(UTC)
    shown = [arg for arg in (sys.argv[1:] if argv is None else argv) if arg != "--no-write"]
    command = shlex.join(["python", "-m", "bench.depth", *shown])
    text = render(
        results,
        command=command,
        started=started,
        finished=finished,
        load=(load_before, _load()),
        version=version,
        note=args.note,
    )
    print(text)
    if not args.no_write:
        write_section("depth", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
