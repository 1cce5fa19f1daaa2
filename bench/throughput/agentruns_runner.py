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
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import psycopg

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores, migrate
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
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
) -> None:
    await asyncio.to_thread(migrate, url)
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


async def drain_worker_loop(
    url: str,
    *,
    concurrency: int,
    step: Callable[[AgentRun], AsyncIterator[StepEvent]] = one_step,
) -> tuple[int, float]:
    """One ``Worker.run`` loop with ``concurrency`` slots: it claims as many runs as it has free
    slots in one statement (batch claims) and drives them as tasks. Timed until every run has
    completed."""
    registry = kinds(step)
    stores = make_postgres_stores(url, None, pool_size=concurrency + 2)
    rng = random.Random(0)
    runs = AgentRuns(stores, registry, rng)
    worker = Worker(
        runs, registry, stores.notifier, rng, holder="bench-loop", concurrency=concurrency,
        poll_interval=0.05,
    )  # fmt: skip
    total = await remaining(url)
    stop = asyncio.Event()

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
        await asyncio.gather(worker.run(stop), watch())
        elapsed = clock.time() - started
    finally:
        await close_postgres_stores(stores)
    return worker.stats.outcomes.get(RunOutcome.COMPLETED, 0), elapsed


async def remaining(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM agent_run WHERE state <> 'ended'")
        row = await cur.fetchone()
    return 0 if row is None else int(row[0])
