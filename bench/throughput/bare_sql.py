"""Diagnostic, not a contender: agentruns' own SQL statements, sent bare.

The adapter's claim, renew, event append and fenced end (the very statements of
``agentruns.adapters.postgres.sql``, on the same schema, triggers and queue), sent by psycopg
directly: the claim in one autocommit statement, then per run (or per batch) one pipelined
transaction renew -> append event -> end, so a run costs two commits as in the raw baseline.
What it measures is the cost of the schema and SQL alone; the gap between it and the
``agentruns`` rows is what the layers above (transactions per step, extra reads, SQLAlchemy,
psycopg's separate BEGIN round trip) add. Fencing still holds: every write is guarded on run,
workspace, epoch and an unexpired lease.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import postgresql

from agentruns.adapters.postgres import sql


def _text(statement: Any) -> str:
    return str(statement.compile(dialect=postgresql.psycopg.dialect()))  # type: ignore[attr-defined]


CLAIM = _text(sql.CLAIM)
RENEW = _text(sql.RENEW)
APPEND = _text(sql.APPEND_EVENT)
END = _text(sql.END_FENCED)


async def _claimer(url: str, batch: int, holder: str) -> int:
    done = 0
    idle = 0
    claim_conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    settle_conn = await psycopg.AsyncConnection.connect(url)
    try:
        while True:
            cur = await claim_conn.execute(
                CLAIM,
                {
                    "now": None, "holder": holder, "limit": batch, "pool": batch + 8,
                    "aging": timedelta(minutes=10), "kinds": None, "alone": True,
                },
                prepare=True,
            )  # fmt: skip
            names = [d.name for d in cur.description or ()]
            rows = [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]
            # The claim answers one row per leased run, or one row with no run and the number
            # of candidates it ranked ("offered"): none offered means nothing left for us.
            claimed = [run for run in rows if run["id"] is not None]
            if not claimed:
                idle += 1
                if not rows or not rows[0].get("offered") or idle > 1000:
                    return done
                continue  # every candidate was held by another claimer: claim again
            idle = 0
            async with settle_conn.pipeline(), settle_conn.transaction():
                for run in claimed:
                    fence = {
                        "now": None,
                        "run_id": run["id"],
                        "workspace": run["workspace"],
                        "epoch": run["epoch"],
                    }
                    await settle_conn.execute(RENEW, fence, prepare=True)
                    await settle_conn.execute(
                        APPEND, {**fence, "type": "step", "data": Jsonb({})}, prepare=True
                    )
                    await settle_conn.execute(
                        END, {**fence, "reason": "completed", "result": None}, prepare=True
                    )
            done += len(claimed)
    finally:
        await claim_conn.close()
        await settle_conn.close()


async def drain(url: str, *, claimers: int, batch: int) -> tuple[int, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    counts = await asyncio.gather(*(_claimer(url, batch, f"bare-{n}") for n in range(claimers)))
    return sum(counts), loop.time() - started
