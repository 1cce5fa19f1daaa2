"""Conversations on PostgreSQL (issue 25, ADRs/0028 and 0031): the bench rows of the issue.

    .venv/bin/python -m bench.conversations [--repeats 50] [--no-results]

- ``interrupt``: a worker in a process of its own (poll interval 5 s, so only the cancel's
  NOTIFY reaches it in time) holds a run whose step sleeps for an hour; an enqueue of the same
  subject with ``on_active=interrupt`` returns in this process, and the time until that step
  sees ``CancelledError`` is measured on the machine's monotonic clock, ``--repeats`` times one
  after the other, each on a subject of its own (target p95 ≤ 1 s). The new run's step returns
  at once, so the worker is idle again before the next. (In one process the step can see the
  cancel before the enqueue's own coroutine resumes, which would read as a negative time.)

A benchmark, not a test: figures depend on the machine. The section ``conversations`` of
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
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from bench.results import table, write_section
from tests.postgres_server import cloned_database, create_template, server_url

# How long the measured step would run if nothing cancelled it.
_LONG_STEP = 3600.0
# The longest one interrupt is waited for before the bench gives up on it.
_GIVE_UP = 30.0


class _Holder:
    """A kind whose run with ``{"long": true}`` sleeps in its step and reports, on ``told``,
    when the step ran and when it saw CancelledError; any other run's step returns at once."""

    def __init__(self, told: Queue[tuple[str, str, float]]) -> None:
        self.told = told

    async def steps(self, run: AgentRun) -> AsyncIterator[StepEvent]:
        if run.payload.get("long"):
            self.told.put(("running", str(run.id), time.perf_counter()))
            try:
                await asyncio.sleep(_LONG_STEP)
            except asyncio.CancelledError:
                # perf_counter is CLOCK_MONOTONIC: one clock for every process of the machine.
                self.told.put(("cancelled", str(run.id), time.perf_counter()))
                raise
        yield StepEvent("answered")


def _worker_process(url: str, told: Queue[tuple[str, str, float]], stop: Event) -> None:
    """The holder's process: a worker on its own pool until ``stop`` is set."""

    async def work() -> None:
        holder = _Holder(told)
        kinds = RunKinds([RunKind(RunKindPolicy("chat"), holder.steps)])
        stores = make_postgres_stores(url, pool_size=4)
        runs = AgentRuns(stores, kinds, random.Random(2))
        worker = Worker(
            runs, kinds, stores.notifier, random.Random(3), holder="w", concurrency=4,
            poll_interval=5,
        )  # fmt: skip
        stopping = asyncio.Event()
        loop = asyncio.create_task(worker.run(stopping, grace=10))
        told.put(("started", "", time.perf_counter()))
        await asyncio.to_thread(stop.wait)
        stopping.set()
        await loop
        await close_postgres_stores(stores)

    asyncio.run(work())


async def _told(told: Queue[tuple[str, str, float]], what: str, run_id: str) -> float:
    """When the worker's process said ``what`` of ``run_id``."""
    while True:
        said, about, at = await asyncio.to_thread(told.get, True, _GIVE_UP)
        if (said, about) == (what, run_id):
            return at


async def _interrupt_latencies(url: str, repeats: int) -> list[tuple[float, float]]:
    """For each interrupt: (from the enqueue's return, from its call) to the old step's
    CancelledError, in seconds."""
    context = multiprocessing.get_context("spawn")
    told: Queue[tuple[str, str, float]] = context.Queue()
    stop = context.Event()
    process = context.Process(target=_worker_process, args=(url, told, stop))
    process.start()
    kinds = RunKinds([RunKind(RunKindPolicy("chat"), _Holder(told).steps)])
    stores = make_postgres_stores(url, pool_size=2)
    runs = AgentRuns(stores, kinds, random.Random(1))
    latencies: list[tuple[float, float]] = []
    try:
        await _told(told, "started", "")
        await asyncio.sleep(0.5)  # the worker listens before the first run is enqueued
        for index in range(repeats):
            subject = f"chat-{index}"
            old = await runs.enqueue(
                "chat", workspace="bench", subject=subject, payload={"long": True}
            )
            await _told(told, "running", str(old.id))
            asked = time.perf_counter()
            await runs.enqueue("chat", workspace="bench", subject=subject, on_active="interrupt")
            returned = time.perf_counter()
            seen = await _told(told, "cancelled", str(old.id))
            latencies.append((seen - returned, seen - asked))
    finally:
        stop.set()
        process.join(30)
        await close_postgres_stores(stores)
    return latencies


def _nearest(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered), math.ceil(len(ordered) * share)) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--no-results", action="store_true")
    options = parser.parse_args()
    started = datetime.now(UTC)
    rows: list[str] = []
    with server_url() as server:
        create_template(server)
        with cloned_database(server) as url:
            measured = asyncio.run(_interrupt_latencies(url, options.repeats))
    after_return = [returned for returned, _ in measured]
    after_call = [called for _, called in measured]
    p50, p95 = statistics.median(after_return), _nearest(after_return, 0.95)
    call_p95 = _nearest(after_call, 0.95)
    early = sum(value <= 0 for value in after_return)
    print(
        f"interrupt: enqueue returned -> the old holder's step saw CancelledError, "
        f"{len(measured)} interrupts: p50 {p50 * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms, "
        f"max {max(after_return) * 1000:.1f} ms; {early} seen before the enqueue returned; "
        f"from the enqueue's call: p95 {call_p95 * 1000:.1f} ms",
        flush=True,
    )
    rows.append(
        f"| interrupt: enqueue returns → the old holder's step sees CancelledError, p95 "
        f"| ≤ 1 s | **{p95 * 1000:.1f} ms** (p50 {p50 * 1000:.1f} ms, {len(measured)} "
        f"interrupts, {early} of them seen before the enqueue returned: a time ≤ 0; from the "
        f"enqueue's call, p95 {call_p95 * 1000:.1f} ms) |"
    )
    text = table("## Conversations (`python -m bench.conversations`)", started, rows)
    print(text)
    if not options.no_results:
        write_section("conversations", text)


if __name__ == "__main__":
    main()
