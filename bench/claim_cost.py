"""What one claim costs as the queue grows: EXPLAIN ANALYZE of the claim statement.

    .venv/bin/python -m bench.claim_cost [--workspaces 1000] [1000 100000 1000000]

Each size gets a fresh database on the embedded server (or AGENTRUNS_TEST_DATABASE_URL's
server): that many queued runs over 1,000 workspaces and up to 100,000 subjects, 500 leased runs
and as many ended runs as queued ones. The claim runs in a transaction that is rolled back, so
every repetition sees the same queue. Reports the median execution time and buffers touched.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import psycopg

from agentruns.adapters.postgres import sql
from bench.population import populate
from tests.postgres_server import cloned_database, create_template, server_url

REPEAT = 15


def _to_psycopg(statement: str) -> str:
    for name in ("now", "holder", "limit", "pool", "aging", "kinds", "alone"):
        statement = statement.replace(f":{name}", f"%({name})s")
    return statement


def measure(url: str, queued: int, limit: int) -> tuple[float, int, float]:
    statement = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _to_psycopg(sql.CLAIM.text)
    params = {
        "now": None,
        "holder": "bench",
        "limit": limit,
        "pool": limit + 8,
        "aging": "10 minutes",
        "kinds": None,
        "alone": True,
    }
    times: list[float] = []
    buffers: list[int] = []
    with psycopg.connect(url) as connection:
        for _ in range(REPEAT):
            with connection.transaction(force_rollback=True):
                row = connection.execute(statement, params).fetchone()
            assert row is not None
            document = row[0] if isinstance(row[0], list) else json.loads(str(row[0]))
            times.append(document[0]["Execution Time"])
            plan = document[0]["Plan"]
            buffers.append(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))
    return statistics.median(times), int(statistics.median(buffers)), min(times)


def main(sizes: list[int], workspaces: int = 1_000) -> None:
    with server_url() as server:
        create_template(server)
        for queued in sizes:
            with cloned_database(server) as url:
                started = time.perf_counter()
                with psycopg.connect(url, autocommit=True) as connection:
                    populate(
                        connection,
                        queued=queued,
                        workspaces=workspaces,
                        subjects=min(queued, 100_000),
                        leased=500,
                        ended=queued,
                    )
                filled = time.perf_counter() - started
                for limit in (1, 10):
                    median, blocks, best = measure(url, queued, limit)
                    print(
                        f"workspaces={workspaces:>5,} queued={queued:>9,} limit={limit:>2}"
                        f"  claim median {median:6.2f} ms"
                        f" (best {best:5.2f})  buffers {blocks:>6}  [populated in {filled:.0f}s]",
                        flush=True,
                    )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    spread = 1_000
    if arguments[:1] == ["--workspaces"]:
        spread, arguments = int(arguments[1]), arguments[2:]
    main([int(arg) for arg in arguments] or [1_000, 100_000, 1_000_000], spread)
