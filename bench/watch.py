"""Watching runs on PostgreSQL (issue 25, part 4, ADRs/0030): the bench rows of the issue.

    .venv/bin/python -m bench.watch [--watchers 100] [--rounds 20] [--many 1000]
                                    [--base 2b895e0] [--loop-rounds 6] [--runs 20000]
                                    [--only ROW] [--no-results]

Each measure runs on a fresh database cloned from the migrated template:

- ``latency``: ``--watchers`` runs, each leased and watched by one ``runs.watch`` in this
  process (one family: one listening connection and its pool); then ``--rounds`` rounds in
  which a writer (another family, its own pool) writes one step event to every run, one after
  the other. The time from a step boundary's return (its commit) to the watcher handing out
  that event, p50 and p95 (target p95 ≤ 50 ms).
- ``connections``: ``--many`` watchers of as many leased runs in one process, all started at
  once; the connections the watching family holds on the server (``pg_stat_activity`` by
  application name) at their peak while the watchers start and once they idle, against its
  pool's bound (``pool_size`` + ``max_overflow``) plus the listening connection (target ≤ 2 +
  the pool).
- ``loop``: the plain worker loop of this tree against ``--base``'s (the revision before the
  watch), as ``bench.steps`` holds it (target ≥ 0.95x): nobody watches, so the triggers'
  emptiness test and key probe are all the loop pays.

A benchmark, not a test: figures depend on the machine. The section ``watch`` of
``bench/RESULTS.md`` is rewritten unless ``--no-results``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from uuid import UUID

import psycopg

from agentruns.adapters.clock import SystemClock
from agentruns.adapters.postgres import PostgresFamily
from agentruns.adapters.postgres.connections import ConnectionOptions
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.runs import AgentRuns
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from bench import steps
from bench.results import table, write_section
from tests.postgres_server import cloned_database, create_template, server_url

WATCHING_APP = "agentruns-bench-watch"
POOL_SIZE, MAX_OVERFLOW = 5, 10


async def _chat(run: AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("said", {})  # never driven: the bench holds the runs itself


KINDS = RunKinds([RunKind(RunKindPolicy(name="chat"), _chat)])


def _runs(url: str, application: str) -> tuple[PostgresFamily, AgentRuns]:
    family = PostgresFamily(
        url,
        SystemClock(),
        pool_size=POOL_SIZE,
        options=ConnectionOptions(application_name=application),
    )
    return family, AgentRuns(family.stores, KINDS, random.Random(7))


async def _lease(runs: AgentRuns, count: int) -> list[AgentRun]:
    for number in range(count):
        await runs.enqueue("chat", workspace=f"ws-{number % 50}", subject=f"chat-{number}")
    leased: list[AgentRun] = []
    while len(leased) < count:
        leased += await runs.claim("bench-writer", limit=min(100, count - len(leased)))
    return leased


async def _latencies(url: str, watchers: int, rounds: int) -> list[float]:
    writer_family, writer = _runs(url, "agentruns-bench-writer")
    watch_family, watching = _runs(url, WATCHING_APP)
    try:
        leased = await _lease(writer, watchers)
        written: dict[tuple[UUID, int], float] = {}
        seen: list[float] = []
        started = asyncio.Event()
        ready = 0

        async def follow(run: AgentRun) -> None:
            nonlocal ready
            async for update in watching.watch(run.id):
                if update.event is None:
                    ready += 1
                    if ready == watchers:
                        started.set()
                    continue
                now = time.perf_counter()
                at = written.get((run.id, update.event.seq))
                # Seen before the writer's call even returned: no wait at all.
                seen.append(0.0 if at is None else now - at)
                if update.event.seq == rounds:
                    return

        tasks = [asyncio.create_task(follow(run)) for run in leased]
        await started.wait()
        for seq in range(1, rounds + 1):
            for run in leased:
                await writer.step_boundary(run.fence, "said", {"round": seq})
                written[(run.id, seq)] = time.perf_counter()
            await asyncio.sleep(0.05)  # the round's last notifications arrive before the next
        async with asyncio.timeout(60):
            await asyncio.gather(*tasks)
        return seen
    finally:
        await watch_family.close()
        await writer_family.close()


def _held(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (WATCHING_APP,),
        ).fetchone()
    return 0 if row is None else int(row[0])


async def _connections(url: str, many: int) -> tuple[int, int]:
    writer_family, writer = _runs(url, "agentruns-bench-writer")
    watch_family, watching = _runs(url, WATCHING_APP)
    peak = 0
    try:
        leased = await _lease(writer, many)
        ready = 0
        started = asyncio.Event()

        async def follow(run: AgentRun) -> None:
            nonlocal ready
            async for update in watching.watch(run.id):
                if update.event is None and not update.ended:
                    ready += 1
                    if ready == many:
                        started.set()

        tasks = [asyncio.create_task(follow(run)) for run in leased]
        while not started.is_set():
            peak = max(peak, await asyncio.to_thread(_held, url))
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # idle: every watcher waits on the one listening connection
        idle = await asyncio.to_thread(_held, url)
        peak = max(peak, idle)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return peak, idle
    finally:
        await watch_family.close()
        await writer_family.close()


def _nearest(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watchers", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--many", type=int, default=1000)
    parser.add_argument("--base", default="2b895e0", help="the revision before the watch")
    parser.add_argument("--loop-rounds", type=int, default=6, help="drains per side of loop")
    parser.add_argument("--runs", type=int, default=20_000, help="runs per drain of the loop row")
    parser.add_argument("--only", choices=("latency", "connections", "loop"))
    parser.add_argument("--no-results", action="store_true")
    options = parser.parse_args()
    started = datetime.now(UTC)
    rows: list[str] = []
    with server_url() as server:
        create_template(server)
        if options.only in (None, "latency"):
            with cloned_database(server) as url:
                seen = asyncio.run(_latencies(url, options.watchers, options.rounds))
            p50, p95 = statistics.median(seen), _nearest(seen, 0.95)
            print(
                f"event written -> seen, {options.watchers} watchers, {len(seen)} events: "
                f"p50 {p50 * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms",
                flush=True,
            )
            rows.append(
                f"| event written → seen by a watcher, {options.watchers} watchers in one "
                f"process, p95 | ≤ 50 ms | **{p95 * 1000:.1f} ms** (p50 {p50 * 1000:.1f} ms, "
                f"{len(seen):,} events) |"
            )
        if options.only in (None, "connections"):
            with cloned_database(server) as url:
                peak, idle = asyncio.run(_connections(url, options.many))
            bound = POOL_SIZE + MAX_OVERFLOW
            print(
                f"{options.many} watchers: {peak} connections at the peak, {idle} idle "
                f"(pool bound {bound}, + the listening connection)",
                flush=True,
            )
            rows.append(
                f"| {options.many:,} watchers in one process: database connections it holds "
                f"| ≤ 2 + the pool ({2 + bound}) | **{peak}** at the peak, **{idle}** once idle "
                f"(pool {POOL_SIZE} + overflow {MAX_OVERFLOW}) |"
            )
    if options.only in (None, "loop"):
        rows.append(
            steps.loop_row(
                options.base,
                options.loop_rounds,
                options.runs,
                what="worker loop, nobody watching",
                before="before the watch",
            )
        )
    text = table("## Watching runs (`python -m bench.watch`)", started, rows)
    print(text)
    if not options.no_results:
        write_section("watch", text)


if __name__ == "__main__":
    main()
