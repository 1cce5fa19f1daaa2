"""``python -m bench.statement_cost``: what each statement of a run costs inside PostgreSQL.

On the throughput bench's queue (10,000 runs, 50 workspaces, 4 runs per subject) and on the raw
baseline's table: EXPLAIN (ANALYZE) of the agentruns claim (limit 1 and 10), of the fenced end
(with its trigger time), and of the raw claim, each repeated and rolled back, medians printed.
The analysis in RESULTS.md quotes these figures.
"""

from __future__ import annotations

import asyncio
import re
import statistics
from datetime import timedelta
from typing import Any

import psycopg

from bench.server import bench_server
from bench.throughput import agentruns_runner, bare_sql, raw

REPEAT = 15
_FIGURES = {
    "execution": re.compile(r"Execution Time: ([\d.]+) ms"),
    "planning": re.compile(r"Planning Time: ([\d.]+) ms"),
    "triggers": re.compile(r"Trigger agent_run_bookkeeping: time=([\d.]+)"),
}


async def _explain(
    conn: psycopg.AsyncConnection[Any], statement: str, params: dict[str, Any]
) -> dict[str, float]:
    found: dict[str, list[float]] = {name: [] for name in _FIGURES}
    for _ in range(REPEAT):
        cur = await conn.execute("EXPLAIN (ANALYZE) " + statement, params)
        text = "\n".join(str(row[0]) for row in await cur.fetchall())
        await conn.rollback()
        for name, pattern in _FIGURES.items():
            match = pattern.search(text)
            if match:
                found[name].append(float(match.group(1)))
    return {name: statistics.median(values) for name, values in found.items() if values}


def _claim(limit: int) -> dict[str, Any]:
    return {
        "now": None, "holder": "explain", "limit": limit, "pool": limit + 8, "alone": True,
        "aging": timedelta(minutes=10), "kinds": None,
    }  # fmt: skip


async def measure(server: Any) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    url = server.create_database("explain")
    await agentruns_runner.prepare(url, 10_000)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        results["agentruns claim, limit 1"] = await _explain(conn, bare_sql.CLAIM, _claim(1))
        results["agentruns claim, limit 10"] = await _explain(conn, bare_sql.CLAIM, _claim(10))
        cur = await conn.execute(bare_sql.CLAIM, _claim(1))
        names = [d.name for d in cur.description or ()]
        run = dict(zip(names, await cur.fetchone() or (), strict=True))
        await conn.commit()
        fence = {
            "now": None, "run_id": run["id"], "workspace": run["workspace"],
            "epoch": run["epoch"], "reason": "completed",
        }  # fmt: skip
        results["agentruns fenced end"] = await _explain(conn, bare_sql.END, fence)
    url = server.create_database("explain_raw")
    await raw.prepare(url, 10_000)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        results["raw claim, batch 1"] = await _explain(conn, raw.CLAIM, {"batch": 1})
        results["raw claim, batch 10"] = await _explain(conn, raw.CLAIM, {"batch": 10})
    return results


def main() -> int:
    with bench_server() as server:
        results = asyncio.run(measure(server))
    print(f"median of {REPEAT} EXPLAIN (ANALYZE), ms")
    print(f"{'statement':28} {'execution':>10} {'triggers':>10} {'planning':>10}")
    for name, figures in results.items():
        print(
            f"{name:28} {figures.get('execution', 0):10.3f} {figures.get('triggers', 0):10.3f} "
            f"{figures.get('planning', 0):10.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
