"""Procrastinate: its own schema, its own worker, a no-op async task.

Jobs are pre-enqueued with the task's ``batch_defer_async`` (Procrastinate's own insert, with its
triggers). The worker runs with ``wait=False`` so it stops once it has caught up with the queue,
and keeps finished jobs (``delete_jobs="never"``, its default) as a user's worker would.
"""

from __future__ import annotations

import asyncio
import logging

import procrastinate

QUEUE = "bench"
_ENQUEUE_CHUNK = 5_000


def _app(url: str, pool_size: int) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=pool_size)
    app = procrastinate.App(connector=connector)

    @app.task(name="noop", queue=QUEUE)
    async def noop() -> None:
        return None

    return app


async def prepare(url: str, jobs: int) -> None:
    app = _app(url, 4)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        task = app.tasks["noop"]
        for start in range(0, jobs, _ENQUEUE_CHUNK):
            count = min(_ENQUEUE_CHUNK, jobs - start)
            await task.batch_defer_async(*({} for _ in range(count)))
    await _vacuum(url)


async def _vacuum(url: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("VACUUM ANALYZE")


async def drain(url: str, *, concurrency: int) -> tuple[int, float]:
    """Time from start until no job is left to do or doing (watched every 20 ms on a connection
    of its own); the worker's own stop afterwards is not timed."""
    import psycopg

    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    app = _app(url, concurrency + 2)
    async with (
        app.open_async(),
        await psycopg.AsyncConnection.connect(url, autocommit=True) as watcher,
    ):
        loop = asyncio.get_running_loop()
        started = loop.time()
        worker = asyncio.create_task(
            app.run_worker_async(
                queues=[QUEUE],
                concurrency=concurrency,
                wait=False,
                install_signal_handlers=False,
                delete_jobs="never",
            )
        )
        while True:
            cur = await watcher.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
            )
            row = await cur.fetchone()
            if row is not None and int(row[0]) == 0:
                break
            if worker.done():
                worker.result()
                raise RuntimeError("the Procrastinate worker stopped before the queue drained")
            await asyncio.sleep(0.02)
        elapsed = loop.time() - started
        await worker
    return await finished(url), elapsed


async def finished(url: str) -> int:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        )
        row = await cur.fetchone()
    return 0 if row is None else int(row[0])
