"""``python -m bench.cohort_plans``: what one cohort of the worker loop writes, against raw SQL.

    .venv/bin/python -m bench.cohort_plans [--cohort 256] [--plans]

On a fresh database of the embedded server holding the throughput bench's queue (15,000 runs,
one step each, 50 workspaces, 4 runs per subject), runs one cohort through the three statements
the worker loop sends for it, exactly as the PostgreSQL adapter sends them: the claim
(``agent_claim``), the group of step boundaries and the group of ends. Then, on the raw SQL
queue, a claim and a settle of the same number of jobs in batches of 10. For each it reports the
statement's time and the rows it wrote per run, by table, from ``pg_stat_user_tables``: heap
tuples inserted, updated (of which HOT: no index entry) and deleted, and the index entries the
non-HOT ones inserted (one per index whose predicate the new tuple meets).

With ``--plans`` it prints each statement's ``EXPLAIN (ANALYZE, BUFFERS)``, the claim's nested
statements through ``auto_explain``. A profile, not a bench with a target: run it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.rows import dict_row

from agentruns.adapters.postgres import sql
from agentruns.adapters.postgres.database import bound
from bench.server import bench_server
from bench.throughput import agentruns_runner, raw

RAW_BATCH = 10

_TABLES = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables
"""

# Per index: the predicate a tuple must meet to get an entry (None: every tuple gets one).
_INDEXES = """
SELECT c.relname AS tab, i.relname AS idx, pg_get_expr(x.indpred, x.indrelid) AS pred
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class c ON c.oid = x.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'
"""


class Counter:
    """Rows written between two calls, per table, from the statistics the server flushes."""

    def __init__(self, conn: psycopg.Connection[dict[str, Any]]) -> None:
        self._conn = conn
        self._before = self._read()

    def _read(self) -> dict[str, tuple[int, int, int, int]]:
        self._conn.execute("SELECT pg_stat_force_next_flush()")
        self._conn.execute("SELECT pg_stat_clear_snapshot()")
        return {
            row["relname"]: (
                row["n_tup_ins"],
                row["n_tup_upd"],
                row["n_tup_hot_upd"],
                row["n_tup_del"],
            )
            for row in self._conn.execute(_TABLES)
        }

    def take(self) -> dict[str, tuple[int, int, int, int]]:
        time.sleep(0.05)
        after = self._read()
        moved = {
            table: tuple(
                a - b for a, b in zip(now, self._before.get(table, (0, 0, 0, 0)), strict=True)
            )
            for table, now in after.items()
        }
        self._before = after
        return {t: (i, u, h, d) for t, (i, u, h, d) in moved.items() if i or u or d}


def _explain(conn: psycopg.Connection[dict[str, Any]], query: str, values: Any) -> list[str]:
    rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {query}", values, prepare=False).fetchall()
    return [str(next(iter(row.values()))) for row in rows]


def _report(label: str, runs: int, seconds: float, written: dict[str, Any], per: str) -> None:
    print(f"{label}: {seconds * 1000:.1f} ms, {seconds * 1e6 / max(runs, 1):.0f} us per {per}")
    for table, (ins, upd, hot, dele) in sorted(written.items()):
        print(
            f"    {table:24} per {per}: inserted {ins / runs:.2f}, updated {upd / runs:.2f} "
            f"(HOT {hot / runs:.2f}), deleted {dele / runs:.2f}"
        )


def _index_entries(
    conn: psycopg.Connection[dict[str, Any]], table: str, ids: list[Any], column: str = "id"
) -> Iterator[str]:
    """The indexes of ``table`` whose predicate the rows ``ids`` now meet: the entries their
    last non-HOT write inserted."""
    for index in conn.execute(_INDEXES).fetchall():
        if index["tab"] != table:
            continue
        pred = index["pred"] or "true"
        met = conn.execute(
            f"SELECT count(*) AS n FROM {table} WHERE {column} = ANY(%s) AND ({pred})", (ids,)
        ).fetchone()
        if met is not None and met["n"]:
            yield f"{index['idx']} ({met['n'] / len(ids):.2f})"


async def main_async(cohort: int, plans: bool) -> None:
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with bench_server() as server:
        url = server.create_database("plans")
        raw_url = server.create_database("plans_raw")
        try:
            await agentruns_runner.prepare(url, 15_000)
            await raw.prepare(raw_url, 15_000)
            with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
                conn.execute("SET plan_cache_mode = force_generic_plan")  # as the adapter's pool
                _agentruns(conn, cohort, plans)
            with psycopg.connect(raw_url, autocommit=True, row_factory=dict_row) as conn:
                _raw(conn, cohort, plans)
        finally:
            server.drop_database(url)
            server.drop_database(raw_url)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _agentruns(conn: psycopg.Connection[dict[str, Any]], cohort: int, plans: bool) -> None:
    claim, claim_values = bound(
        sql.CLAIM,
        {"now": None, "aging": "10 minutes", "holder": "plans", "limit": cohort, "alone": True},
    )
    # Warm the claim's plans and the ledger: a cohort taken and ended untimed first.
    for _ in range(2):
        taken = conn.execute(claim, claim_values).fetchall()
        _step_and_end(conn, taken, timed=False, plans=False)
    counter = Counter(conn)
    started = time.perf_counter()
    taken = conn.execute(claim, claim_values).fetchall()
    seconds = time.perf_counter() - started
    _report(f"agentruns claim of {len(taken)}", len(taken), seconds, counter.take(), "run")
    print(
        "    index entries of a claimed run: "
        + ", ".join(_index_entries(conn, "agent_run", [row["id"] for row in taken]))
    )
    _step_and_end(conn, taken, timed=True, plans=plans, counter=counter)
    if plans:
        _claim_stages(conn, cohort)


# Marks in a copy of the claim: the server's time at each stage of one claim (the statements of
# a PL/pgSQL function have no EXPLAIN of their own without a server module this build lacks).
_STAGES = (
    ("    IF EXISTS (SELECT 1 FROM agent_workspace_delta) THEN", "start"),
    ("    LOOP\n        scale := 1;", "folded"),
    ("            EXIT WHEN candidates IS NOT NULL;", "ranked"),
    ("        ids := ids || more;", "leased"),
    ("    RETURN QUERY", "rows"),
)


def _claim_stages(conn: psycopg.Connection[dict[str, Any]], cohort: int) -> None:
    row = conn.execute("SELECT pg_get_functiondef('agent_claim'::regproc) AS src").fetchone()
    assert row is not None
    source = str(row["src"]).replace("FUNCTION public.agent_claim(", "FUNCTION pg_temp.stages(")
    for anchor, tag in _STAGES:
        assert anchor in source, f"the claim changed: mark its stage {tag} again"
        mark = f"RAISE NOTICE '{tag} %', clock_timestamp();"
        indent = anchor[: len(anchor) - len(anchor.lstrip())]
        source = source.replace(anchor, f"{indent}{mark}\n{anchor}", 1)
    source = source.replace(
        "END\n$function$", "RAISE NOTICE 'end %', clock_timestamp();\nEND\n$function$"
    )
    conn.execute(source)
    stamps: list[tuple[str, str]] = []

    def stamp(notice: psycopg.errors.Diagnostic) -> None:
        tag, _, at = str(notice.message_primary).partition(" ")
        stamps.append((tag, at))

    conn.add_notice_handler(stamp)
    for _ in range(3):
        stamps.clear()
        taken = conn.execute(
            "SELECT * FROM pg_temp.stages(NULL, interval '10 minutes', 'plans', %s)", (cohort,)
        ).fetchall()
        _step_and_end(conn, taken, timed=False, plans=False)
    rows = conn.execute(
        "SELECT t.tag, (t.at::timestamptz - first_value(t.at::timestamptz) OVER ()) AS since "
        "FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS t (tag, at, n) ORDER BY n",
        ([tag for tag, _ in stamps], [at for _, at in stamps]),
    ).fetchall()
    print(
        f"-- stages of a claim of {len(taken)} (ms since its start): "
        + ", ".join(f"{r['tag']} {r['since'].total_seconds() * 1000:.1f}" for r in rows)
    )


def _step_and_end(
    conn: psycopg.Connection[dict[str, Any]],
    taken: list[dict[str, Any]],
    *,
    timed: bool,
    plans: bool,
    counter: Counter | None = None,
) -> None:
    fences = [[str(row["id"]), row["workspace"], row["epoch"]] for row in taken]
    steps = json.dumps([[*fence, "step", {}] for fence in fences])
    ends = json.dumps([[*fence, "completed"] for fence in fences])
    for label, statement, writes in (
        ("step boundaries", sql.RENEW_AND_APPEND_MANY, steps),
        ("ends", sql.END_MANY, ends),
    ):
        query, values = bound(statement, {"now": None, "writes": writes})
        if plans and timed:
            with conn.transaction(force_rollback=True):
                print(f"-- EXPLAIN (ANALYZE, BUFFERS): group of {len(taken)} {label}")
                print("\n".join(_explain(conn, query, values)))
            if counter is not None:
                counter.take()  # the rolled-back run counts in the statistics: not this one's
        started = time.perf_counter()
        conn.execute(query, values, prepare=True).fetchall()
        seconds = time.perf_counter() - started
        if timed and counter is not None:
            _report(
                f"agentruns group of {len(taken)} {label}",
                len(taken),
                seconds,
                counter.take(),
                "run",
            )
    if timed:
        ids = [row["id"] for row in taken]
        print(
            "    index entries of an ended run: "
            + ", ".join(_index_entries(conn, "agent_run", ids))
        )


def _raw(conn: psycopg.Connection[dict[str, Any]], cohort: int, plans: bool) -> None:
    claim = raw.CLAIM.replace("%(batch)s", str(RAW_BATCH))
    for _ in range(3):  # warm
        ids = [row["id"] for row in conn.execute(claim).fetchall()]
        conn.execute(raw.SETTLE_MANY, {"ids": ids})
    counter = Counter(conn)
    claimed: list[int] = []
    claim_seconds = settle_seconds = 0.0
    while len(claimed) < cohort:
        started = time.perf_counter()
        ids = [row["id"] for row in conn.execute(claim, prepare=True).fetchall()]
        claim_seconds += time.perf_counter() - started
        started = time.perf_counter()
        conn.execute(raw.SETTLE_MANY, {"ids": ids}, prepare=True)
        settle_seconds += time.perf_counter() - started
        claimed += ids
    written = counter.take()
    _report(
        f"raw SQL claims of {RAW_BATCH} ({len(claimed)} jobs)",
        len(claimed),
        claim_seconds,
        {},
        "job",
    )
    _report(f"raw SQL settles of {RAW_BATCH}", len(claimed), settle_seconds, written, "job")
    print("    index entries of a settled job: " + ", ".join(_index_entries(conn, "job", claimed)))
    if plans:
        with conn.transaction(force_rollback=True):
            print(f"-- EXPLAIN (ANALYZE, BUFFERS): raw claim of {RAW_BATCH}")
            print("\n".join(_explain(conn, claim, None)))
            ids = [row["id"] for row in conn.execute(claim).fetchall()]
            print(f"-- EXPLAIN (ANALYZE, BUFFERS): raw settle of {RAW_BATCH}")
            print("\n".join(_explain(conn, raw.SETTLE_MANY, {"ids": ids})))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cohort_plans", description=__doc__)
    parser.add_argument("--cohort", type=int, default=256, help="runs per cohort (256)")
    parser.add_argument("--plans", action="store_true", help="print EXPLAIN (ANALYZE, BUFFERS)")
    args = parser.parse_args(argv)
    asyncio.run(main_async(args.cohort, args.plans))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
