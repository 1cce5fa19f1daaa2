"""``python -m bench.guard_cost``: what the schema's fence guards cost each hot statement.

Two small databases on one server, the same few hundred runs in each: one migrated to
``0003_workspace_subjects`` (no fence guards) and one to the head (``0004_fence_guards``). Each
hot statement of the adapter runs under EXPLAIN (ANALYZE, BUFFERS, WAL) ``--repeat`` times in a
transaction that is rolled back, so every repetition meets the same rows; the medians of the
execution time, of each trigger's time, and of buffers and WAL records are printed side by side.
This is a cost probe of single statements on an idle small database, not a throughput bench.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.adapters.postgres import sql as statements
from agentruns.adapters.postgres.migrate import migrate
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.runs import AgentRuns
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.termination import TerminationReason
from bench.server import bench_server

_TRIGGER = re.compile(r"Trigger (\w+)(?: on \w+)?: time=([\d.]+) calls=(\d+)")
_EXECUTION = re.compile(r"Execution Time: ([\d.]+) ms")
_BUFFERS = re.compile(r"Buffers: shared hit=(\d+)(?: read=(\d+))?")
_WAL = re.compile(r"WAL: records=(\d+)")


def _psycopg(statement: str) -> str:
    return re.sub(r"(?<!:):(\w+)", r"%(\1)s", statement)


async def _nothing(run: object) -> Any:
    return
    yield


async def _populate(url: str, runs: int) -> list[tuple[UUID, str, int]]:
    """``runs`` queued runs over 10 workspaces, half of them leased, a quarter of those ended
    after one step event; returns the fences of the leased ones still leased."""
    stores = make_postgres_stores(url)
    kinds = RunKinds([RunKind(RunKindPolicy(name="chat"), _nothing)])
    agent = AgentRuns(stores, kinds, random.Random(0))
    try:
        for number in range(runs):
            await agent.enqueue(
                "chat", workspace=f"ws-{number % 10}", subject=f"s-{number}", payload={"n": number}
            )
        leased = await agent.claim("bench", limit=runs // 2)
        for run in leased[: len(leased) // 4]:
            await agent.step_boundary(run.fence, "step", {"i": 1})
            await agent.end(run.fence, TerminationReason.COMPLETED)
        return [(run.id, run.workspace, run.epoch) for run in leased[len(leased) // 4 :]]
    finally:
        await close_postgres_stores(stores)


def _figures(text: str) -> dict[str, float]:
    figures = {"execution ms": float(_EXECUTION.findall(text)[0])}
    buffers = _BUFFERS.search(text)
    if buffers:
        figures["buffers"] = float(buffers.group(1)) + float(buffers.group(2) or 0)
    wal = _WAL.search(text)
    figures["WAL records"] = float(wal.group(1)) if wal else 0.0
    for name, time, _calls in _TRIGGER.findall(text):
        figures[f"{name} ms"] = figures.get(f"{name} ms", 0.0) + float(time)
    return figures


class Side:
    """One database: its connection and the fences of its leased runs."""

    def __init__(self, url: str, runs: int) -> None:
        self.fences = asyncio.run(_populate(url, runs))
        self.conn = psycopg.connect(url)
        self.conn.execute("SET plan_cache_mode = force_generic_plan")
        self.conn.commit()
        self.found: dict[str, dict[str, list[float]]] = {}

    def fence(self, index: int) -> dict[str, Any]:
        run_id, workspace, epoch = self.fences[index % len(self.fences)]
        return {"now": None, "run_id": run_id, "workspace": workspace, "epoch": epoch}

    def explain(self, case: str, statement: str, params: dict[str, Any]) -> None:
        with self.conn.transaction(force_rollback=True):
            rows = self.conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, WAL) " + _psycopg(statement), params
            ).fetchall()
        figures = _figures("\n".join(str(row[0]) for row in rows))
        for name, value in figures.items():
            self.found.setdefault(case, {}).setdefault(name, []).append(value)

    def medians(self) -> dict[str, dict[str, float]]:
        return {
            case: {name: statistics.median(values) for name, values in figures.items()}
            for case, figures in self.found.items()
        }


def _cases(side: Side) -> dict[str, tuple[str, Callable[[int], dict[str, Any]]]]:
    claim = {
        "now": None, "holder": "probe", "limit": 1, "pool": 9, "aging": "10 minutes",
        "kinds": None,
    }  # fmt: skip

    def step(index: int) -> dict[str, Any]:
        return {**side.fence(index), "type": "step", "data": Jsonb({"i": index})}

    return {
        "claim, limit 1": (statements.CLAIM.text, lambda _: claim),
        "renew": (statements.RENEW.text, side.fence),
        "step boundary (renew + event)": (statements.RENEW_AND_APPEND.text, step),
        "append under a held fence": (statements.APPEND_EVENT.text, step),
        "fenced end": (
            statements.END_FENCED.text,
            lambda i: {**side.fence(i), "reason": "completed"},
        ),
        "charged requeue": (
            statements.REQUEUE.text,
            lambda i: {**side.fence(i), "charge": 1, "delay": "0 seconds", "retry_budget": 3},
        ),
        "purge (ended runs with events)": (
            statements.PURGE.text,
            lambda _: {"ended_before": "infinity", "limit": 1000},
        ),
    }


def measure(urls: list[str], runs: int, repeat: int) -> list[dict[str, dict[str, float]]]:
    """The medians per side; the sides take turns at every repetition, so a change of the
    machine's load meets them alike."""
    sides = [Side(url, runs) for url in urls]
    try:
        for case in _cases(sides[0]):
            for index in range(repeat):
                for side in sides:
                    statement, params = _cases(side)[case]
                    side.explain(case, statement, params(index))
        return [side.medians() for side in sides]
    finally:
        for side in sides:
            side.conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=51)
    args = parser.parse_args()
    with bench_server() as server:
        before_url = server.create_database("guards_before")
        migrate(before_url, "0003_workspace_subjects")
        after_url = server.create_database("guards_after")
        migrate(after_url)
        before, after = measure([before_url, after_url], args.runs, args.repeat)
    print(f"median of {args.repeat} EXPLAIN (ANALYZE, BUFFERS, WAL), {args.runs} runs")
    print(f"  {'':40} {'0003':>9} {'0004':>9}")
    for name in before:
        print(f"\n{name}")
        for figure in sorted(set(before[name]) | set(after[name])):
            old, new = before[name].get(figure), after[name].get(figure)
            shown = [f"{value:9.3f}" if value is not None else f"{'-':>9}" for value in (old, new)]
            print(f"  {figure:40} {shown[0]} {shown[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
