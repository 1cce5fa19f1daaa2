"""What one page of the read API costs as the runs table grows: EXPLAIN ANALYZE of the
``list_runs`` statements (ADRs/0013).

    .venv/bin/python -m bench.list_cost [100000 1000000]

Each size gets a fresh database on the embedded server (or AGENTRUNS_TEST_DATABASE_URL's
server): that many queued runs and as many ended ones over 1,000 workspaces and up to 100,000
subjects, 500 leased. A page is 51 rows (50 and one to know whether more follow), newest first;
each filter set is its own statement on a generic plan, as the adapter runs it. Reports the
median execution time and the buffers touched.
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

REPEAT = 9
PAGES: dict[str, dict[str, object]] = {
    "everything": {},
    "workspace": {"workspace": "ws-7"},
    "workspace+subject": {"workspace": "ws-7", "subject": "subject-7"},
    "state=leased": {"state": "leased"},
    "kind+reason": {"kind": "review", "reason": "completed"},
}


def measure(url: str, filters: dict[str, object]) -> tuple[float, int]:
    text = sql.list_runs(filters).text
    for name in (*filters, "limit"):
        text = text.replace(f":{name}", f"%({name})s")
    statement = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text
    times: list[float] = []
    buffers: list[int] = []
    with psycopg.connect(url) as connection:
        connection.execute("SET plan_cache_mode = force_generic_plan")
        for _ in range(REPEAT):
            row = connection.execute(statement, {**filters, "limit": 51}).fetchone()
            assert row is not None
            document = row[0] if isinstance(row[0], list) else json.loads(str(row[0]))
            times.append(document[0]["Execution Time"])
            plan = document[0]["Plan"]
            buffers.append(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))
    return statistics.median(times), int(statistics.median(buffers))


def main(sizes: list[int]) -> None:
    with server_url() as server:
        create_template(server)
        for queued in sizes:
            with cloned_database(server) as url:
                started = time.perf_counter()
                with psycopg.connect(url, autocommit=True) as connection:
                    populate(
                        connection,
                        queued=queued,
                        workspaces=1_000,
                        subjects=min(queued, 100_000),
                        leased=500,
                        ended=queued,
                    )
                    connection.execute("ANALYZE agent_run")
                filled = time.perf_counter() - started
                for name, filters in PAGES.items():
                    median, blocks = measure(url, filters)
                    print(
                        f"runs={2 * queued + 500:>9,} page={name:<18} median {median:8.2f} ms"
                        f"  buffers {blocks:>7}  [populated in {filled:.0f}s]",
                        flush=True,
                    )


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [100_000, 1_000_000])
