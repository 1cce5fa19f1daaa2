"""Waits and signals on PostgreSQL (issue 24, ADRs/0025): the bench rows of the issue.

    .venv/bin/python -m bench.waits [--waiting 100000] [--queued 10000] [--wakes 50]
                                    [--signals 10000] [--clients 8] [--base c8e1c72]
                                    [--rounds 6] [--runs 20000] [--claim-rounds 41] [--only ROW]
                                    [--no-results]

Each measure runs on a fresh database cloned from the migrated template:

- ``claim``: the claim statement's execution time and buffers (EXPLAIN ANALYZE, rolled back,
  as ``bench.claim_cost`` measures it) over ``--queued`` due runs in 1,000 workspaces, in one
  database alone and in another populated alike beside ``--waiting`` runs that wait (parked, a
  wait's end a day away, each its subject's head, in the same workspaces), ``--claim-rounds``
  rounds alternating the two: p50 of each side's round medians, and their ratio (target
  ≤ 1.2x).
- ``wake``: an idle worker (poll interval 5 s, so only a NOTIFY wakes it in time) and
  ``--wakes`` runs one after the other, each signalled once it has given its lease back to wait:
  the time from the signal's call to the wait's return in the run's next epoch, p50 and p95
  (target p95 ≤ 200 ms).
- ``signals``: ``--signals`` signal ids over a tenth as many waiting runs, each id delivered
  twice, the deliveries shuffled over ``--clients`` processes that deliver at once (8 tasks
  each, each process with its own pool): rows stored per id, and deliveries answered
  ``created`` per id (target: every id stored once, created once).
- ``loop``: the plain worker loop of this tree against ``--base``'s (the revision before the
  waits), as ``bench.steps`` holds it (target ≥ 0.95x).

A benchmark, not a test: figures depend on the machine. The section ``waits`` of
``bench/RESULTS.md`` is rewritten unless ``--no-results``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID

import psycopg

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.recorded import RecordedSteps, StepContext
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from bench import steps
from bench.claim_cost import measure
from bench.population import populate
from bench.results import table, write_section
from tests.postgres_server import cloned_database, create_template, server_url

# The waiting runs, beside the population's: each on a subject of its own (its head), in the
# population's workspaces, waiting a day for the signal "go", written as a wait's give-back
# leaves a run (queued, due at the wait's end, parked: ADRs/0029). The lanes are folded again
# afterwards, as the population's bookkeeping folds them.
WAITING = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt, seq,
                       enqueued_at, due_at, lease, head, claimed_at, waiting_for,
                       waiting_until, parked)
SELECT gen_random_uuid(), 'chat', 'ws-' || (g %% %(workspaces)s), 'waiting-' || g, g %% 3, '{}',
       'queued', 1, 0, nextval('agent_run_seq'), now() - interval '1 hour',
       now() + interval '1 day', interval '30 seconds', true, now() - interval '1 hour', 'go',
       now() + interval '1 day', true
FROM generate_series(1, %(count)s) AS g
"""

REFOLD = """
INSERT INTO agent_workspace_delta (workspace, leased, bands) SELECT id, 0, 7 FROM agent_workspace;
SELECT agent_lane_fold();
"""


def _claim_p50(server: str, queued: int, waiting: int, rounds: int) -> dict[int, _Sides]:
    """Per limit (1 and 10), the claim over ``queued`` due runs in one database and beside
    ``waiting`` waits in another populated alike: ``rounds`` rounds, each measuring one side
    then the other (15 claims each), so a change of the machine's pace between rounds falls on
    both sides alike."""
    with cloned_database(server) as alone_url, cloned_database(server) as beside_url:
        for url, waits in ((alone_url, 0), (beside_url, waiting)):
            with psycopg.connect(url, autocommit=True) as connection:
                populate(connection, queued=queued, workspaces=1_000, subjects=queued, leased=500)
                if waits:
                    with connection.transaction():
                        connection.execute("ALTER TABLE agent_run DISABLE TRIGGER USER")
                        connection.execute(WAITING, {"count": waits, "workspaces": 1_000})
                        connection.execute("ALTER TABLE agent_run ENABLE TRIGGER USER")
                        connection.execute(REFOLD)
                connection.execute("VACUUM ANALYZE agent_run")
        sides = {limit: _Sides() for limit in (1, 10)}
        for _ in range(rounds):
            for limit, side in sides.items():
                for url, times, blocks in (
                    (alone_url, side.alone, side.alone_blocks),
                    (beside_url, side.beside, side.beside_blocks),
                ):
                    median, buffers, _best = measure(url, queued, limit)
                    times.append(median)
                    blocks.append(buffers)
        return sides


@dataclass
class _Sides:
    """One limit's per-round claim medians (ms) and buffers, alone and beside the waits."""

    alone: list[float] = field(default_factory=list)
    beside: list[float] = field(default_factory=list)
    alone_blocks: list[int] = field(default_factory=list)
    beside_blocks: list[int] = field(default_factory=list)

    def ratio(self) -> float:
        return statistics.median(self.beside) / statistics.median(self.alone)

    def round_ratios(self) -> list[float]:
        return [b / a for a, b in zip(self.alone, self.beside, strict=True)]


class _Waiter:
    """A kind that waits for "go" and notes when its wait returned."""

    def __init__(self) -> None:
        self.parked: dict[UUID, asyncio.Event] = {}
        self.resumed: dict[UUID, float] = {}
        self.resumed_event: dict[UUID, asyncio.Event] = {}

    async def steps(self, run: AgentRun, ctx: StepContext) -> None:
        try:
            await ctx.wait_for("go", timeout=timedelta(hours=1))
        except BaseException:
            self.parked.setdefault(run.id, asyncio.Event()).set()
            raise
        self.resumed[run.id] = time.perf_counter()
        self.resumed_event.setdefault(run.id, asyncio.Event()).set()


async def _wake_latencies(url: str, wakes: int) -> list[float]:
    waiter = _Waiter()
    kinds = RunKinds([RunKind(RunKindPolicy("chat"), RecordedSteps(waiter.steps))])
    stores = make_postgres_stores(url, pool_size=4)
    runs = AgentRuns(stores, kinds, random.Random(1))
    worker = Worker(
        runs, kinds, stores.notifier, random.Random(2), holder="w", concurrency=8, poll_interval=5
    )
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run(stop, grace=10))
    latencies: list[float] = []
    try:
        for index in range(wakes):
            run = await runs.enqueue("chat", workspace="bench", subject=f"wake-{index}")
            parked = waiter.parked.setdefault(run.id, asyncio.Event())
            resumed = waiter.resumed_event.setdefault(run.id, asyncio.Event())
            async with asyncio.timeout(30):
                await parked.wait()
            await asyncio.sleep(0.05)  # the park committed; the worker is idle again
            asked = time.perf_counter()
            await runs.signal(run.id, "go", {"n": index}, signal_id=f"go-{index}")
            async with asyncio.timeout(30):
                await resumed.wait()
            latencies.append(waiter.resumed[run.id] - asked)
    finally:
        stop.set()
        await loop
        await close_postgres_stores(stores)
    return latencies


async def _park(url: str, count: int) -> list[str]:
    """``count`` runs waiting for "go" (parked by a worker, as production parks them)."""
    waiter = _Waiter()
    kinds = RunKinds([RunKind(RunKindPolicy("chat"), RecordedSteps(waiter.steps))])
    stores = make_postgres_stores(url, pool_size=4)
    runs = AgentRuns(stores, kinds, random.Random(1))
    try:
        ids = [
            str((await runs.enqueue("chat", workspace=f"ws-{n % 10}", subject=f"s-{n}")).id)
            for n in range(count)
        ]
        worker = Worker(runs, kinds, stores.notifier, random.Random(2), holder="w", concurrency=64)
        while len(waiter.parked) < count:
            if not await worker.claim_and_drive(64):
                break
        return ids
    finally:
        await close_postgres_stores(stores)


def _client(url: str, deliveries: list[tuple[str, str]]) -> list[str]:
    """One client process: deliver each (run id, signal id) with 8 tasks; the ids it created."""

    async def deliver() -> list[str]:
        stores = make_postgres_stores(url, pool_size=8)
        runs = AgentRuns(stores, RunKinds(), random.Random(1))
        created: list[str] = []
        queue = list(deliveries)

        async def task() -> None:
            while queue:
                run_id, signal_id = queue.pop()
                delivered = await runs.signal(
                    UUID(run_id), "go", {"id": signal_id}, signal_id=signal_id
                )
                if delivered.created:
                    created.append(signal_id)

        try:
            await asyncio.gather(*(task() for _ in range(8)))
        finally:
            await close_postgres_stores(stores)
        return created

    return asyncio.run(deliver())


def _signals(server: str, total: int, clients: int) -> dict[str, float]:
    with cloned_database(server) as url:
        run_ids = asyncio.run(_park(url, max(1, total // 10)))
        ids = [(run_ids[n % len(run_ids)], f"sig-{n}") for n in range(total)]
        deliveries = ids + ids  # each id delivered twice, by whichever clients draw it
        random.Random(3).shuffle(deliveries)
        shares = [deliveries[n::clients] for n in range(clients)]
        started = time.perf_counter()
        with multiprocessing.get_context("spawn").Pool(clients) as pool:
            created = [
                made
                for share in pool.starmap(_client, [(url, s) for s in shares])
                for made in share
            ]
        seconds = time.perf_counter() - started
        with psycopg.connect(url) as connection:
            stored = Counter(
                str(row[0]) for row in connection.execute("SELECT signal_id FROM agent_run_signal")
            )
            woken = connection.execute(
                "SELECT count(*) FROM agent_run WHERE state = 'queued' AND waiting_until IS NULL"
            ).fetchone()
    made = Counter(created)
    return {
        "ids": total,
        "deliveries": len(deliveries),
        "stored_once": sum(1 for n in range(total) if stored[f"sig-{n}"] == 1),
        "stored_rows": sum(stored.values()),
        "created_once": sum(1 for n in range(total) if made[f"sig-{n}"] == 1),
        "created": len(created),
        "runs": len(run_ids),
        "woken": int(woken[0]) if woken else 0,
        "per_second": len(deliveries) / seconds,
    }


def _nearest(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered), math.ceil(len(ordered) * share)) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--wakes", type=int, default=50)
    parser.add_argument("--signals", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--base", default="c8e1c72", help="the revision before the waits")
    parser.add_argument("--rounds", type=int, default=6, help="drains per side of the loop row")
    parser.add_argument("--runs", type=int, default=20_000, help="runs per drain of the loop row")
    parser.add_argument("--claim-rounds", type=int, default=41, help="rounds of the claim row")
    parser.add_argument("--only", choices=("claim", "wake", "signals", "loop"))
    parser.add_argument("--no-results", action="store_true")
    options = parser.parse_args()
    started = datetime.now(UTC)
    rows: list[str] = []
    with server_url() as server:
        create_template(server)
        if options.only in (None, "claim"):
            sides = _claim_p50(server, options.queued, options.waiting, options.claim_rounds)
            for limit, side in sides.items():
                spread = ", ".join(f"{ratio:.2f}" for ratio in side.round_ratios())
                print(
                    f"claim limit {limit}: p50 {statistics.median(side.beside):.2f} ms with "
                    f"{options.waiting:,} waiting vs {statistics.median(side.alone):.2f} ms with "
                    f"none ({side.ratio():.2f}x; per round {spread}); buffers "
                    f"{statistics.median(side.beside_blocks):.0f} vs "
                    f"{statistics.median(side.alone_blocks):.0f}; {options.queued:,} due",
                    flush=True,
                )
            one, ten = sides[1], sides[10]
            rows.append(
                f"| claim p50 with {options.waiting:,} runs waiting vs with none "
                f"({options.queued:,} due runs, 1,000 workspaces; {options.claim_rounds} "
                f"alternating rounds of 15 claims), limit 1 / 10 | ≤ 1.2x | "
                f"**{one.ratio():.2f}x** / **{ten.ratio():.2f}x** (buffers "
                f"{statistics.median(one.beside_blocks):.0f} vs "
                f"{statistics.median(one.alone_blocks):.0f} / "
                f"{statistics.median(ten.beside_blocks):.0f} vs "
                f"{statistics.median(ten.alone_blocks):.0f}) |"
            )
        if options.only in (None, "wake"):
            with cloned_database(server) as url:
                latencies = asyncio.run(_wake_latencies(url, options.wakes))
            p50, p95 = statistics.median(latencies), _nearest(latencies, 0.95)
            print(
                f"signal -> the wait returns in the next claim, idle worker, {len(latencies)} "
                f"runs: p50 {p50 * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms",
                flush=True,
            )
            rows.append(
                f"| signal → the run is claimed again by an idle worker (its wait returns), p95 "
                f"| ≤ 200 ms | **{p95 * 1000:.1f} ms** (p50 {p50 * 1000:.1f} ms, "
                f"{len(latencies)} signals) |"
            )
        if options.only in (None, "signals"):
            sent = _signals(server, options.signals, options.clients)
            print(
                f"signals: {sent['ids']:,.0f} ids delivered twice each ({sent['deliveries']:,.0f} "
                f"deliveries) by {options.clients} processes to {sent['runs']:,.0f} waiting "
                f"runs: {sent['stored_once']:,.0f} stored once ({sent['stored_rows']:,.0f} rows), "
                f"{sent['created_once']:,.0f} created once ({sent['created']:,.0f} created "
                f"answers), {sent['woken']:,.0f} runs woken; "
                f"{sent['per_second']:,.0f} deliveries/s",
                flush=True,
            )
            rows.append(
                f"| {sent['ids']:,.0f} signals delivered concurrently by {options.clients} "
                f"client processes (each id twice): delivered exactly once each | "
                f"{sent['ids']:,.0f} / {sent['ids']:,.0f} | **{sent['stored_once']:,.0f} / "
                f"{sent['ids']:,.0f}** stored once ({sent['stored_rows']:,.0f} rows), "
                f"{sent['created_once']:,.0f} answered `created` once "
                f"({sent['created']:,.0f} in all) |"
            )
    if options.only in (None, "loop"):
        rows.append(
            steps.loop_row(
                options.base,
                options.rounds,
                options.runs,
                what="worker loop with no waits",
                before="before the waits",
            )
        )
    text = table("## Waits and signals (`python -m bench.waits`)", started, rows)
    print(text)
    if not options.no_results:
        write_section("waits", text)


if __name__ == "__main__":
    main()
