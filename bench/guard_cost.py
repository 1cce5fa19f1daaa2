"""``python -m bench.guard_cost``: what the schema's fence guards cost each hot statement.

Small databases on one server, the same few hundred runs in each: ``before`` (migrated to
``0006_failure_records``, the revision before the fence guards), ``0004`` (the head:
``0004_fence_guards``), and two designs ADRs/0016 rejected: ``before+checks`` (the one-row rules
as CHECK constraints) and ``0004-row-events`` (the event guard as a row trigger reading each
event's run FOR SHARE). Each hot statement of the adapter runs under EXPLAIN (ANALYZE, BUFFERS,
WAL) ``--repeat`` times in a transaction that is rolled back, so every repetition meets the same
rows, the databases taking turns; the medians of the execution time, of each trigger's time, and
of buffers and WAL records are printed side by side. A cost probe of single statements on a
small database, not a throughput bench.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from agentruns.adapters.postgres import (
    close_postgres_stores,
    make_postgres_stores,
    sql as statements,
)
from agentruns.adapters.postgres.migrate import migrate
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.runs import AgentRuns
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.termination import TerminationReason
from bench.server import bench_server

GROUP = 20
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
    kinds = RunKinds([RunKind(RunKindPolicy(name="chat", lease=timedelta(hours=1)), _nothing)])
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
        # Statistics now, so that autovacuum does not change a side's plans halfway.
        self.conn.execute("ANALYZE")
        self.conn.execute("SET plan_cache_mode = force_generic_plan")
        self.conn.commit()
        self.found: dict[str, dict[str, list[float]]] = {}

    def fence(self, index: int) -> dict[str, Any]:
        run_id, workspace, epoch = self.fences[index % len(self.fences)]
        return {"now": None, "run_id": run_id, "workspace": workspace, "epoch": epoch}

    def group(self, index: int) -> dict[str, Any]:
        """The step boundaries of :data:`GROUP` distinct leased runs, as the worker's group
        commit writes them (ADRs/0011)."""
        fences = [self.fences[(index * GROUP + n) % len(self.fences)] for n in range(GROUP)]
        return {
            "now": None,
            "ids": [run_id for run_id, _, _ in fences],
            "workspaces": [workspace for _, workspace, _ in fences],
            "epochs": [epoch for _, _, epoch in fences],
            "types": ["step"] * GROUP,
            "datas": ['{"i": 1}'] * GROUP,
        }

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
        "append alone (run not locked yet)": (statements.APPEND_EVENT.text, step),
        f"group of {GROUP} step boundaries": (statements.RENEW_AND_APPEND_MANY.text, side.group),
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


# The rejected designs, applied over a migrated database.
_CHECKS = """
ALTER TABLE agent_run
    ADD CONSTRAINT ck_probe_reason CHECK (end_reason IS NULL OR end_reason IN ('completed',
        'cancelled', 'failed', 'retries_exhausted', 'not_retryable', 'deadline_exceeded',
        'continued')),
    ADD CONSTRAINT ck_probe_lease CHECK (lease > interval '0'),
    ADD CONSTRAINT ck_probe_queued CHECK (state <> 'queued' OR (leased_until IS NULL
        AND holder IS NULL AND end_reason IS NULL AND ended_at IS NULL)),
    ADD CONSTRAINT ck_probe_leased CHECK (state <> 'leased' OR (leased_until IS NOT NULL
        AND holder IS NOT NULL AND end_reason IS NULL AND ended_at IS NULL)),
    ADD CONSTRAINT ck_probe_ended CHECK (state <> 'ended' OR (end_reason IS NOT NULL
        AND ended_at IS NOT NULL AND leased_until IS NULL))
"""


# The event guard first written: a row trigger that reads each event's run FOR SHARE.
_ROW_EVENTS = """
DROP TRIGGER guard_agent_run_event_insert ON agent_run_event;
CREATE FUNCTION probe_event_row() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    run_state text;
    run_epoch integer;
BEGIN
    SELECT r.state, r.epoch INTO run_state, run_epoch
        FROM agent_run r WHERE r.id = NEW.run_id FOR SHARE;
    IF FOUND AND (run_state <> 'leased' OR run_epoch <> NEW.epoch) THEN
        RAISE EXCEPTION 'stale event' USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER guard_agent_run_event BEFORE INSERT ON agent_run_event
    FOR EACH ROW EXECUTE FUNCTION probe_event_row();
"""


# The core chain's head before 0004_fence_guards.
BEFORE = "0006_failure_records"

VARIANTS: dict[str, tuple[str, Callable[[], str] | None]] = {
    "before": (BEFORE, None),
    "0004": ("head", None),
    "before+checks": (BEFORE, lambda: _CHECKS),
    "0004-row-events": ("head", lambda: _ROW_EVENTS),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=51)
    args = parser.parse_args()
    with bench_server() as server:
        urls = []
        for name, (revision, patch) in VARIANTS.items():
            url = server.create_database("guards_" + name.replace("+", "_").replace("-", "_"))
            migrate(url, revision)
            if patch is not None:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(patch())
            urls.append(url)
        results = measure(urls, args.runs, args.repeat)
    print(f"median of {args.repeat} EXPLAIN (ANALYZE, BUFFERS, WAL), {args.runs} runs, ms")
    print(f"  {'':36}" + "".join(f"{name:>16}" for name in VARIANTS))
    for case in results[0]:
        print(f"\n{case}")
        for figure in sorted(set().union(*(result[case] for result in results))):
            values = [result[case].get(figure) for result in results]
            shown = "".join(f"{v:16.3f}" if v is not None else f"{'-':>16}" for v in values)
            print(f"  {figure:36}{shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
