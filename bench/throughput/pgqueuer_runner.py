"""PgQueuer: its own schema and QueueManagers, a no-op entrypoint, drained in ``drain`` mode.

``consumers`` QueueManagers each own one psycopg connection and dequeue ``batch`` jobs per round
trip (the setting its own benchmark uses). Jobs are pre-enqueued with its batch ``enqueue``.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import psycopg
from pgqueuer.db import PsycopgDriver
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

ENTRYPOINT = "noop"
_ENQUEUE_CHUNK = 5_000


async def _connect(url: str) -> psycopg.AsyncConnection[object]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


async def prepare(url: str, jobs: int) -> None:
    conn = await _connect(url)
    try:
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        for start in range(0, jobs, _ENQUEUE_CHUNK):
            count = min(_ENQUEUE_CHUNK, jobs - start)
            await queries.enqueue([ENTRYPOINT] * count, [None] * count, [0] * count)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def drain(url: str, *, consumers: int, batch: int) -> tuple[int, float]:
    """Time from start until every job is settled in the database (its row gone from the
    ``pgqueuer`` table, which PgQueuer deletes when it flushes a finished job's status),
    watched every 20 ms on a connection of its own. The managers' own shutdown (seconds of
    buffer timeouts) is not timed: it would swamp small queues."""
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    total = await remaining(url)
    handled = 0
    conns = [await _connect(url) for _ in range(consumers)]
    watcher = await _connect(url)
    managers: list[QueueManager] = []
    for conn in conns:
        qm = QueueManager(Queries(PsycopgDriver(conn)))

        @qm.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            nonlocal handled
            handled += 1

        managers.append(qm)
    loop = asyncio.get_running_loop()
    started = loop.time()
    running = [
        asyncio.create_task(
            qm.run(
                batch_size=batch,
                dequeue_timeout=timedelta(seconds=1),
                log_aggregation_interval=timedelta(0),
            )
        )
        for qm in managers
    ]
    try:
        while True:
            cur = await watcher.execute("SELECT count(*) FROM pgqueuer")
            row = await cur.fetchone()
            if row is not None and int(row[0]) == 0:
                break
            if any(task.done() for task in running):
                raise RuntimeError("a PgQueuer manager stopped before the queue drained")
            await asyncio.sleep(0.02)
        elapsed = loop.time() - started
    finally:
        for qm in managers:
            qm.shutdown.set()
        await asyncio.gather(*running, return_exceptions=True)
        for conn in [*conns, watcher]:
            if not conn.closed:
                await conn.close()
    return min(handled, total), elapsed


async def remaining(url: str) -> int:
    async with await _connect(url) as conn:
        cur = await conn.execute("SELECT count(*) FROM pgqueuer")
        row = await cur.fetchone()
    return 0 if row is None else int(row[0])
