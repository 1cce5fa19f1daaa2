"""The raw SQL baselines: the least a PostgreSQL queue can do per job, written in the bench.

A job is claimed with ``FOR UPDATE SKIP LOCKED`` in one statement (its own transaction) and then
settled in a second one, over psycopg 3 async connections in autocommit mode. ``batch`` claims up
to that many jobs in the claim statement and settles them together. No fencing, no fairness, no
events: the floor every real job layer pays more than.
"""

from __future__ import annotations

import asyncio

import psycopg

SCHEMA = """
CREATE TABLE job (
    id bigserial PRIMARY KEY,
    state text NOT NULL DEFAULT 'queued',
    payload jsonb NOT NULL DEFAULT '{}',
    run_at timestamptz NOT NULL DEFAULT now(),
    locked_at timestamptz,
    done_at timestamptz
);
CREATE INDEX job_queued ON job (run_at, id) WHERE state = 'queued';
"""

CLAIM = """
UPDATE job SET state = 'running', locked_at = now()
WHERE id IN (
    SELECT id FROM job
    WHERE state = 'queued' AND run_at <= now()
    ORDER BY run_at, id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id
"""

SETTLE_ONE = "UPDATE job SET state = 'done', done_at = now() WHERE id = %(id)s"
SETTLE_MANY = "UPDATE job SET state = 'done', done_at = now() WHERE id = ANY(%(ids)s)"


async def prepare(url: str, jobs: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(SCHEMA)
        await conn.execute(
            "INSERT INTO job (payload) SELECT '{}'::jsonb FROM generate_series(1, %(n)s)",
            {"n": jobs},
        )
        await conn.execute("VACUUM ANALYZE job")


async def _worker(conn: psycopg.AsyncConnection[object], batch: int) -> int:
    done = 0
    async with conn.cursor() as cur:
        while True:
            await cur.execute(CLAIM, {"batch": batch}, prepare=True)
            ids = [row[0] for row in await cur.fetchall()]  # type: ignore[index]
            if not ids:
                return done
            if batch == 1:
                await cur.execute(SETTLE_ONE, {"id": ids[0]}, prepare=True)
            else:
                await cur.execute(SETTLE_MANY, {"ids": ids}, prepare=True)
            done += len(ids)


async def drain(url: str, *, connections: int, batch: int) -> tuple[int, float]:
    """Drain the queue with ``connections`` workers claiming ``batch`` at a time."""
    conns = [
        await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(connections)
    ]
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        counts = await asyncio.gather(*(_worker(conn, batch) for conn in conns))
        elapsed = loop.time() - started
    finally:
        for conn in conns:
            await conn.close()
    return sum(counts), elapsed


async def remaining(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM job WHERE state <> 'done'")
        row = await cur.fetchone()
    return 0 if row is None else int(row[0])
