"""The worker's hot path on PostgreSQL: per-statement latency and whole-drain throughput.

    .venv/bin/python -m bench.hot_path [--runs 5000] [--repeats 3]

Each measurement runs on a fresh database cloned from the migrated template, filled with
``--runs`` queued no-op runs (10 workspaces, one subject per run) whose steps yield one event:

- ``latency``: one connection, 2,000 runs: claim (limit 1), step boundary (renew + event), end,
  in ms per call (median);
- ``worker cN``: one :class:`~agentruns.app.worker.Worker` at concurrency N drains the queue;
- ``claimers 8``: eight loops of claim (limit 1), one step boundary, end.

A benchmark, not a test: the figures depend on the machine and on what else runs on it, so
compare before and after in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.metrics import NoMetrics
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import TerminationReason
from bench.population import populate
from tests.postgres_server import cloned_database, create_template, server_url


async def _one_step(run: AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("step", {"n": 1})


def _kinds() -> RunKinds:
    # bench.population queues runs of these two kinds.
    return RunKinds(RunKind(RunKindPolicy(name), _one_step) for name in ("chat", "review"))


def _fresh(server: str, runs: int, use: Callable[[str], Awaitable[str]]) -> str:
    with cloned_database(server) as url:
        with psycopg.connect(url, autocommit=True) as connection:
            populate(connection, queued=runs, workspaces=10, subjects=runs)
        return asyncio.run(use(url))


async def latency(url: str) -> str:
    stores = make_postgres_stores(url, pool_size=1)
    runs = AgentRuns(stores, _kinds(), random.Random(1))
    claim, step, end = [], [], []
    try:
        for _ in range(2_000):
            t0 = time.perf_counter()
            (run,) = await runs.claim("bench")
            t1 = time.perf_counter()
            await runs.step_boundary(run.fence, "step", {"n": 1})
            t2 = time.perf_counter()
            await runs.end(run.fence, TerminationReason.COMPLETED)
            t3 = time.perf_counter()
            claim.append(t1 - t0)
            step.append(t2 - t1)
            end.append(t3 - t2)
    finally:
        await close_postgres_stores(stores)

    def ms(values: list[float]) -> str:
        return f"{statistics.median(values[100:]) * 1000:.2f}"

    return f"claim {ms(claim)} ms, step {ms(step)} ms, end {ms(end)} ms"


class _Drained(NoMetrics):
    """Sets ``done`` once ``total`` runs have ended."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = asyncio.Event()

    def ended(self, kind: str, reason: TerminationReason) -> None:
        self.total -= 1
        if self.total == 0:
            self.done.set()


async def worker_drain(url: str, concurrency: int, total: int) -> str:
    stores = make_postgres_stores(url, pool_size=concurrency + 2)
    runs = AgentRuns(stores, _kinds(), random.Random(1))
    drained = _Drained(total)
    worker = Worker(
        runs,
        runs.kinds,
        stores.notifier,
        random.Random(2),
        holder="w",
        concurrency=concurrency,
        metrics=drained,
    )
    stop = asyncio.Event()
    started = time.perf_counter()
    try:
        task = asyncio.create_task(worker.run(stop, grace=60))
        await drained.done.wait()
        elapsed = time.perf_counter() - started
        stop.set()
        await task
    finally:
        await close_postgres_stores(stores)
    return f"{total / elapsed:,.0f} runs/s"


async def claimers(url: str, count: int, total: int) -> str:
    stores = make_postgres_stores(url, pool_size=count)
    runs = AgentRuns(stores, _kinds(), random.Random(1))
    done = 0

    async def loop(name: str) -> None:
        nonlocal done
        while True:
            claimed = await runs.claim(name)
            if not claimed:
                return
            run = claimed[0]
            await runs.step_boundary(run.fence, "step", {"n": 1})
            await runs.end(run.fence, TerminationReason.COMPLETED)
            done += 1

    started = time.perf_counter()
    try:
        await asyncio.gather(*(loop(f"c{index}") for index in range(count)))
    finally:
        await close_postgres_stores(stores)
    assert done == total, done
    return f"{total / (time.perf_counter() - started):,.0f} runs/s"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="latency,c8,c40,claimers")
    options = parser.parse_args()
    n = options.runs
    chosen = options.only.split(",")
    with server_url() as server:
        create_template(server)
        for repeat in range(options.repeats):
            if "latency" in chosen:
                print(f"[{repeat}] latency: {_fresh(server, 2_000, latency)}", flush=True)
            for c in (8, 40):
                if f"c{c}" in chosen:

                    async def drain(url: str, c: int = c) -> str:
                        return await worker_drain(url, c, n)

                    print(f"[{repeat}] worker c{c}: {_fresh(server, n, drain)}", flush=True)
            if "claimers" in chosen:

                async def single(url: str) -> str:
                    return await claimers(url, 8, n)

                print(f"[{repeat}] claimers 8: {_fresh(server, n, single)}", flush=True)


if __name__ == "__main__":
    main()
