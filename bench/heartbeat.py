"""The heartbeat and the cancel on PostgreSQL (issue 23, ADRs/0023).

    .venv/bin/python -m bench.heartbeat [--runs 10000] [--lease 1.5] [--seconds 10]
                                        [--cancels 50] [--no-results]

Two measures, each on a fresh database cloned from the migrated template:

- ``heartbeat``: ``--runs`` queued runs whose one step waits until the bench ends it (a model
  call longer than the lease), drained by one worker at concurrency ``--runs``; their leases are
  ``--lease`` seconds, so the keeper must renew every run every third of that. Once every run is
  in its step, the renewals written over ``--seconds`` give renewals/s sustained (target
  ≥ 10,000/s at 10,000 runs); a lease lost meanwhile (a heartbeat that came too late) is
  counted. Then the steps are released and the runs complete.
- ``cancel``: an idle worker (concurrency 8) and ``--cancels`` runs one after the other, each
  cancelled once its step waits: the time from the cancel's call to the step's CancelledError,
  p50 and p95 (target p95 ≤ 1 s).

A benchmark, not a test: figures depend on the machine. The section ``heartbeat`` of
``bench/RESULTS.md`` is rewritten unless ``--no-results`` (a smoke run at a tiny size).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import psycopg

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import RunOutcome
from bench.population import populate
from bench.results import write_section
from tests.postgres_server import cloned_database, create_template, server_url


class _LongSteps:
    """One step that waits for ``release`` (every run in its step at once)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting = 0

    async def steps(self, run: AgentRun) -> AsyncIterator[StepEvent]:
        self.waiting += 1
        try:
            await self.release.wait()
        finally:
            self.waiting -= 1
        yield StepEvent("step", {"n": 1})


async def heartbeat(url: str, total: int, lease: float, seconds: float) -> dict[str, float]:
    long = _LongSteps()
    # bench.population queues runs of these two kinds.
    kinds = RunKinds(
        RunKind(RunKindPolicy(name, lease=timedelta(seconds=lease)), long.steps)
        for name in ("chat", "review")
    )
    stores = make_postgres_stores(url, pool_size=8)
    runs = AgentRuns(stores, kinds, random.Random(1))
    worker = Worker(runs, kinds, stores.notifier, random.Random(2), holder="w", concurrency=total)
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run(stop, grace=60))
    try:
        started = time.perf_counter()
        while long.waiting < total:
            if time.perf_counter() - started > 120:
                raise RuntimeError(f"only {long.waiting} of {total} runs reached their step")
            await asyncio.sleep(0.05)
        claimed = time.perf_counter() - started
        before = worker.keeper.renewals
        began = time.perf_counter()
        await asyncio.sleep(seconds)
        renewed = worker.keeper.renewals - before
        elapsed = time.perf_counter() - began
        lost = worker.stats.outcomes.get(RunOutcome.LEASE_LOST, 0)
        long.release.set()
        for _ in range(2400):  # two minutes at most
            if sum(worker.stats.outcomes.values()) >= total:
                break
            await asyncio.sleep(0.05)
        completed = worker.stats.outcomes.get(RunOutcome.COMPLETED, 0)
    finally:
        long.release.set()
        stop.set()
        await loop
        await close_postgres_stores(stores)
    return {
        "claimed_seconds": claimed,
        "renewals_per_second": renewed / elapsed,
        # The keeper renews a run once a third of its lease has passed, at its next look (a
        # tenth of the lease later at most): the rate it asks of the store if it keeps up.
        "demanded_per_second": total / (lease / 3 + min(1.0, lease / 10)),
        "lost": lost,
        "completed": completed,
    }


class _Calls:
    """A step that waits until cancelled, noting when the cancel reached it."""

    def __init__(self) -> None:
        self.calling = asyncio.Event()
        self.reached = asyncio.Event()
        self.at = 0.0

    async def steps(self, run: AgentRun) -> AsyncIterator[StepEvent]:
        self.calling.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.at = time.perf_counter()
            self.reached.set()
            raise
        yield StepEvent("never", {})  # pragma: no cover


async def cancel_latency(url: str, cancels: int) -> list[float]:
    calls = _Calls()
    kinds = RunKinds([RunKind(RunKindPolicy("chat"), calls.steps)])
    stores = make_postgres_stores(url, pool_size=4)
    runs = AgentRuns(stores, kinds, random.Random(1))
    worker = Worker(
        runs, kinds, stores.notifier, random.Random(2), holder="w", concurrency=8, poll_interval=1
    )
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run(stop, grace=10))
    latencies: list[float] = []
    try:
        for index in range(cancels):
            calls.calling.clear()
            calls.reached.clear()
            run = await runs.enqueue("chat", workspace="bench", subject=f"cancel-{index}")
            async with asyncio.timeout(30):
                await calls.calling.wait()
            await asyncio.sleep(0.02)  # an idle worker: its loop is back in its wait
            asked = time.perf_counter()
            await runs.cancel(run.id)
            async with asyncio.timeout(30):
                await calls.reached.wait()
            latencies.append(calls.at - asked)
    finally:
        stop.set()
        await loop
        await close_postgres_stores(stores)
    return latencies


def _fresh_heartbeat(server: str, total: int, lease: float, seconds: float) -> dict[str, float]:
    with cloned_database(server) as url:
        with psycopg.connect(url, autocommit=True) as connection:
            populate(connection, queued=total, workspaces=10, subjects=total)
            with connection.transaction():  # the bench's own lease length, under no guard
                connection.execute("ALTER TABLE agent_run DISABLE TRIGGER USER")
                connection.execute(
                    "UPDATE agent_run SET lease = make_interval(secs => %(lease)s)",
                    {"lease": lease},
                )
                connection.execute("ALTER TABLE agent_run ENABLE TRIGGER USER")
        return asyncio.run(heartbeat(url, total, lease, seconds))


def _fresh_cancels(server: str, cancels: int) -> list[float]:
    with cloned_database(server) as url:
        return asyncio.run(cancel_latency(url, cancels))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--lease", type=float, default=1.5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cancels", type=int, default=50)
    parser.add_argument("--no-results", action="store_true")
    options = parser.parse_args()
    with server_url() as server:
        create_template(server)
        beat = _fresh_heartbeat(server, options.runs, options.lease, options.seconds)
        print(
            f"heartbeat: {options.runs:,} runs in long steps, lease {options.lease:g} s: "
            f"{beat['renewals_per_second']:,.0f} renewals/s sustained over {options.seconds:g} s "
            f"(the keeper's cadence asks {beat['demanded_per_second']:,.0f}/s), "
            f"{beat['lost']:.0f} lost, "
            f"{beat['completed']:.0f} completed; all in their step after "
            f"{beat['claimed_seconds']:.1f} s",
            flush=True,
        )
        latencies = sorted(_fresh_cancels(server, options.cancels))
        p50 = statistics.median(latencies)
        p95 = latencies[min(len(latencies), math.ceil(len(latencies) * 0.95)) - 1]  # nearest rank
        print(
            f"cancel -> CancelledError on an idle worker, {len(latencies)} cancels: "
            f"p50 {p50 * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms",
            flush=True,
        )
    if options.no_results:
        return
    write_section(
        "heartbeat",
        "\n".join(
            [
                "## Heartbeat and cancel (`python -m bench.heartbeat`)",
                "",
                "| measure | target | measured |",
                "| --- | ---: | ---: |",
                f"| heartbeat over {options.runs:,} leased runs in long steps (lease "
                f"{options.lease:g} s), renewals/s sustained | ≥ 10,000/s | "
                f"{beat['renewals_per_second']:,.0f}/s ({beat['lost']:.0f} leases lost) |",
                f"| cancel → the step sees `CancelledError`, idle worker, p95 | ≤ 1 s | "
                f"{p95 * 1000:.1f} ms (p50 {p50 * 1000:.1f} ms) |",
            ]
        ),
    )


if __name__ == "__main__":
    main()
