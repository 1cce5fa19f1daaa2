"""agentruns on PostgreSQL, as a host runs it: ``AgentRuns`` and ``Worker.claim_and_drive``.

Everything that costs is on: every claim is fenced (a new epoch per claim, every write guarded on
it), fair (the claim orders by effective band with aging, then the workspace with the fewest
leased runs, then age, one leased run per subject), and every run has one step, whose event is
persisted after the lease is renewed, before the run ends COMPLETED (``steps=0``: no step, so a
run costs its claim and its end, as the raw single-claim baseline's job does). Runs are spread
over ``WORKSPACES`` workspaces (``workspaces=1``: a single-tenant host) and ``RUNS_PER_SUBJECT``
runs per subject, so subject FIFO is exercised.

The queue is filled with one ``INSERT ... SELECT`` through the adapter's own table and triggers
(the bookkeeping trigger keeps the subject heads the claim reads), which is what
``AgentRuns.enqueue`` writes, N at a time.

``drain_worker_processes`` runs the same worker loop in two (or more) OS processes at once over
one queue, as a host scaling out on one machine would: each its own ``AgentRuns``, pool and
``Worker``, started together once every one has warmed its pool.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import random
import resource
import time
import traceback
from collections.abc import AsyncIterator, Callable, MutableSequence
from datetime import timedelta
from functools import partial
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event as ProcessEvent
from typing import TypeVar

import psycopg

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores, migrate
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.ports import Stores
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import RunOutcome

KIND = "bench"
NO_STEP_KIND = "bench-no-step"
WORKSPACES = 50
RUNS_PER_SUBJECT = 4

POPULATE = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt,
                       enqueued_at, due_at, lease)
SELECT gen_random_uuid(), %(kind)s,
       'ws-' || (i %% %(workspaces)s), 'subject-' || (i %% %(subjects)s),
       CASE WHEN i %% 10 = 0 THEN 2 ELSE 1 END, '{}'::jsonb, 'queued', 0, 0,
       now(), now() - interval '1 second', interval '30 seconds'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
ORDER BY i
"""

# Rows per inserting statement: the enqueue trigger takes each new run's subject lock until the
# transaction ends, and a default server's lock table (max_locks_per_transaction 64) holds only
# some ten thousand of them, so a 100,000-run fill in one statement runs out of shared memory.
CHUNK = 5_000

# What a worker process answers: its index, then (runs completed, finish time, CPU seconds) or
# why it failed.
Answer = tuple[int, tuple[int, float, float] | str]
T = TypeVar("T")


async def one_step(run: AgentRun) -> AsyncIterator[StepEvent]:
    """A no-op run with one step: one renewal and one persisted event."""
    yield StepEvent("step", {})


async def no_step(run: AgentRun) -> AsyncIterator[StepEvent]:
    """A run with no step: claimed, then ended."""
    return
    yield  # pragma: no cover - makes this an async generator


def kinds(step: Callable[[AgentRun], AsyncIterator[StepEvent]] = one_step) -> RunKinds:
    """The bench's kinds; ``step`` is what the one-step kind runs (a profile may weigh it)."""
    lease = timedelta(seconds=30)
    return RunKinds(
        [
            RunKind(RunKindPolicy(name=KIND, lease=lease), step),
            RunKind(RunKindPolicy(name=NO_STEP_KIND, lease=lease), no_step),
        ]
    )


async def prepare(
    url: str,
    jobs: int,
    *,
    workspaces: int = WORKSPACES,
    steps: int = 1,
    runs_per_subject: int = RUNS_PER_SUBJECT,
    revision: str = "head",
) -> None:
    await asyncio.to_thread(migrate, url, revision)
    subjects = max(1, jobs // runs_per_subject)
    kind = KIND if steps else NO_STEP_KIND
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for first in range(1, jobs + 1, CHUNK):
            await conn.execute(
                POPULATE,
                {
                    "kind": kind,
                    "workspaces": workspaces,
                    "subjects": subjects,
                    "first": first,
                    "last": min(jobs, first + CHUNK - 1),
                },
            )
        await conn.execute("VACUUM ANALYZE")


async def drain(url: str, *, claimers: int, batch: int, shared: bool = False) -> tuple[int, float]:
    """``claimers`` tasks each claim up to ``batch`` runs and drive them, until none is left.

    Each claimer is a ``Worker`` of its own, or, with ``shared``, all call ``claim_and_drive``
    on one ``Worker``, whose group commit then lets their step boundaries and ends share
    transactions as a worker process's would.
    """
    registry = kinds()
    stores = make_postgres_stores(url, None, pool_size=claimers * batch + 2)
    rng = random.Random(0)
    runs = AgentRuns(stores, registry, rng)
    workers = [
        Worker(runs, registry, stores.notifier, rng, holder=f"bench-{n}", concurrency=batch)
        for n in range(1 if shared else claimers)
    ]

    async def loop(worker: Worker) -> None:
        while await worker.claim_and_drive(batch):
            pass

    try:
        # Warm the pool so the clock does not time connection setup.
        async with stores.scope.transaction():
            pass
        clock = asyncio.get_running_loop()
        started = clock.time()
        await asyncio.gather(*(loop(workers[n % len(workers)]) for n in range(claimers)))
        elapsed = clock.time() - started
    finally:
        await close_postgres_stores(stores)
    claimed = sum(worker.stats.claimed for worker in workers)
    completed = sum(worker.stats.outcomes.get(RunOutcome.COMPLETED, 0) for worker in workers)
    if completed != claimed:
        raise RuntimeError(f"claimed {claimed} runs but completed {completed}")
    return completed, elapsed


def _loop_worker(
    url: str, concurrency: int, holder: str, rng: random.Random, registry: RunKinds
) -> tuple[Stores, Worker]:
    """The worker loop's stores (a pool for every slot) and its ``Worker``."""
    stores = make_postgres_stores(url, None, pool_size=concurrency + 2)
    runs = AgentRuns(stores, registry, rng)
    worker = Worker(
        runs, registry, stores.notifier, rng, holder=holder, concurrency=concurrency,
        poll_interval=0.05,
    )  # fmt: skip
    return stores, worker


async def drain_worker_loop(
    url: str,
    *,
    concurrency: int,
    step: Callable[[AgentRun], AsyncIterator[StepEvent]] = one_step,
    reaper_every: float | None = None,
) -> tuple[int, float]:
    """One ``Worker.run`` loop with ``concurrency`` slots: it claims as many runs as it has free
    slots in one statement (batch claims) and drives them as tasks. Timed until every run has
    completed. With ``reaper_every``, a reaper ticks that often beside it, as on a replica, and
    so moves the ended runs out of ``agent_run`` as the drain goes (ADRs/0035)."""
    registry = kinds(step)
    stores, worker = _loop_worker(url, concurrency, "bench-loop", random.Random(0), registry)
    total = await remaining(url)
    stop = asyncio.Event()
    tasks = [worker.run(stop)]
    if reaper_every is not None:
        reaper = AgentRunReaper(stores, registry, random.Random(1))
        tasks.append(reaper.run(stop, every=reaper_every))

    async def watch() -> None:
        # The worker counts outcomes and offers no event to wait on: poll its counter.
        while worker.stats.outcomes.get(RunOutcome.COMPLETED, 0) < total:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        stop.set()

    try:
        async with stores.scope.transaction():
            pass
        clock = asyncio.get_running_loop()
        started = clock.time()
        await asyncio.gather(*tasks, watch())
        elapsed = clock.time() - started
    finally:
        await close_postgres_stores(stores)
    return worker.stats.outcomes.get(RunOutcome.COMPLETED, 0), elapsed


def process_cpu() -> float:
    """This process's CPU seconds so far (user and system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _loop_in_process(
    url: str, concurrency: int, index: int, completed: MutableSequence[int], total: int,
    ready: ProcessEvent, go: ProcessEvent,
) -> tuple[int, float, float]:  # fmt: skip
    """One process's worker loop: warm the pool, say so, wait for ``go``, then loop until the
    processes together have completed ``total`` runs. (runs it completed, the monotonic time it
    finished, its CPU seconds from ``go`` to then)."""
    stores, worker = _loop_worker(
        url, concurrency, f"bench-loop-{index}", random.Random(index), kinds()
    )
    stop = asyncio.Event()

    async def watch() -> None:
        # Each process publishes its own count in its own slot and stops on the sum: a process
        # that finds nothing to claim may only be waiting for a subject the other holds.
        while True:
            completed[index] = worker.stats.outcomes.get(RunOutcome.COMPLETED, 0)
            if sum(completed) >= total:
                break
            await asyncio.sleep(0.005)
        stop.set()

    try:
        async with stores.scope.transaction():
            pass
        ready.set()
        await asyncio.to_thread(go.wait)
        cpu = process_cpu()
        await asyncio.gather(worker.run(stop), watch())
        finished = time.monotonic()
        cpu = process_cpu() - cpu
    finally:
        await close_postgres_stores(stores)
    return worker.stats.outcomes.get(RunOutcome.COMPLETED, 0), finished, cpu


def _loop_process(
    url: str, concurrency: int, index: int, completed: MutableSequence[int], total: int,
    ready: ProcessEvent, go: ProcessEvent, results: multiprocessing.Queue[Answer],
) -> None:  # fmt: skip
    """A worker process's entry point: its loop's result, or its failure, onto ``results``."""
    try:
        answer = asyncio.run(_loop_in_process(url, concurrency, index, completed, total, ready, go))
    except Exception as error:
        traceback.print_exc()
        results.put((index, f"{type(error).__name__}: {error}"))
    else:
        results.put((index, answer))


def _wait_for(what: Callable[[], T | None], children: list[SpawnProcess], *, ready: bool) -> T:
    """Call ``what`` (a wait of one second at most) until it answers; fail if a child died (or,
    while waiting for them to be ``ready``, exited at all: it answers why on the results)."""
    while True:
        answer = what()
        if answer is not None:
            return answer
        dead = [
            child.name
            for child in children
            if child.exitcode is not None and (ready or child.exitcode != 0)
        ]
        if dead:
            raise RuntimeError(f"worker process(es) {', '.join(dead)} exited (see stderr)")


def _set(event: ProcessEvent) -> bool | None:
    return True if event.wait(1.0) else None


def _result(results: multiprocessing.Queue[Answer]) -> Answer | None:
    try:
        return results.get(timeout=1.0)
    except queue.Empty:
        return None


async def drain_worker_processes(
    url: str, *, concurrency: int, processes: int = 2
) -> tuple[int, float, float]:
    """``processes`` worker OS processes (spawned), each one ``Worker.run`` loop with
    ``concurrency`` slots, draining the same queue at once. Timed from the moment all are told
    to start (each has its pool warm) until the last one has seen every run completed:
    (runs completed, seconds, the processes' CPU seconds summed over that time)."""
    context = multiprocessing.get_context("spawn")
    total = await remaining(url)
    completed = context.RawArray("q", processes)
    ready = [context.Event() for _ in range(processes)]
    go = context.Event()
    results: multiprocessing.Queue[Answer] = context.Queue()
    children = [
        context.Process(
            target=_loop_process,
            args=(url, concurrency, n, completed, total, ready[n], go, results),
            name=f"bench-loop-{n}",
            daemon=True,
        )
        for n in range(processes)
    ]
    for child in children:
        child.start()
    try:
        for event in ready:
            await asyncio.to_thread(_wait_for, partial(_set, event), children, ready=True)
        started = time.monotonic()
        go.set()
        found: dict[int, tuple[int, float, float]] = {}
        while len(found) < processes:
            index, answer = await asyncio.to_thread(
                _wait_for, partial(_result, results), children, ready=False
            )
            if isinstance(answer, str):
                raise RuntimeError(f"worker process {index} failed: {answer}")
            found[index] = answer
    finally:
        for child in children:
            await asyncio.to_thread(child.join, 30.0)
            if child.is_alive():
                child.kill()
    done = sum(answer[0] for answer in found.values())
    finished = max(answer[1] for answer in found.values())
    cpu = sum(answer[2] for answer in found.values())
    return done, finished - started, cpu


async def remaining(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM agent_run WHERE state <> 'ended'")
        row = await cur.fetchone()
    return 0 if row is None else int(row[0])
