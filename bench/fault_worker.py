"""A worker or reaper process of the fault run: ``python -m bench.fault_worker``.

``--role worker`` runs ``Worker.run`` for the fault run's kinds until SIGTERM; ``--role reaper``
runs ``AgentRunReaper.run``. The kind's steps read their script from the payload (how many steps,
how long each sleeps, how and until which attempt they fail, whether the holder turns zombie).

The ``fault-recorded`` kind is written with recorded steps (ADRs/0022): each step's function
first writes one row to ``fault_step_execution`` (the bench's own table) in a statement of its
own, autocommitted, and only then works and returns; a row is an execution that happened, even
when a SIGKILL follows at once. Its zombie holder stalls inside a step's function, so the step
that ran is refused its record and must run again under the next epoch. A step asked for while
replaying, which returns its recorded result without running, is journaled as ``replayed``.

The ``fault-waiting`` kind (ADRs/0025) runs a recorded step ``plan``, waits for the signal ``go``
(an hour at most: the fault driver's signaller delivers it, some before the run gets there), sleeps
durably for a moment, then runs the recorded step ``answer``, whose function writes what the wait
returned to ``fault_wait_answer`` (with the id of its ``fault_step_execution`` row): a row is an
answer acted on.

A zombie holder's process stalls past its lease (the event loop blocked, so its lease keeper
sends no heartbeat either), then tries to write under its old fence: an explicit
``append_event`` and ``end``, then the next step boundary (renew, then append). Every attempt and
whether the store accepted it is written, one JSON line each, to ``--journal``: a line written
with ``os.write`` survives the SIGKILL that may follow.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.recorded import RecordedSteps, StepContext
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.backoff import Backoff
from agentruns.domain.errors import LeaseLost
from agentruns.domain.failures import FallbackChainExhausted, ProviderError
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import TerminationReason

KIND = "fault"
RECORDED_KIND = "fault-recorded"
WAITING_KIND = "fault-waiting"
WAIT_TIMEOUT = timedelta(hours=1)
WAIT_SLEEP = timedelta(milliseconds=200)
LEASE = timedelta(seconds=3)
BACKOFF = Backoff(base=timedelta(milliseconds=200), cap=timedelta(seconds=2), jitter=0.2)
ZOMBIE_PAUSE = LEASE.total_seconds() + 1.5


class Journal:
    """Append-only JSON lines, each one ``os.write`` (no buffer for a SIGKILL to lose)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **record: object) -> None:
        os.write(self._fd, (json.dumps(record, default=str) + "\n").encode())


def _failure(kind: object) -> Exception:
    if kind == "chain-401":
        return FallbackChainExhausted(
            [ProviderError("primary", status=503), ProviderError("fallback", status=401)]
        )
    if kind == "chain-503":
        return FallbackChainExhausted(
            [ProviderError("primary", status=429), ProviderError("fallback", status=503)]
        )
    return ProviderError(f"provider answered {kind}", status=int(str(kind)))


def fault_kind(runs_ref: list[AgentRuns], journal: Journal, holder: str) -> RunKind:
    """The fault run's kind; ``runs_ref`` is filled once the use case exists."""

    async def steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        script = run.payload
        count = int(script.get("steps", 1))  # type: ignore[arg-type]
        pause = float(script.get("sleep", 0.01))  # type: ignore[arg-type]
        for index in range(count):
            await asyncio.sleep(pause)
            if index == 0 and script.get("zombie") and run.epoch == 1:
                await _zombie(run)
            yield StepEvent("step", {"index": index, "holder": holder})
            if index == 0 and script.get("zombie") and run.epoch == 1:
                # Resumed after the boundary: the store took a write under an expired lease.
                journal.write(event="stale-accepted", what="boundary", run=run.id)
        fail = script.get("fail")
        if fail is not None and run.attempt < int(script.get("fail_until", 99)):  # type: ignore[arg-type]
            raise _failure(fail)

    async def _zombie(run: AgentRun) -> None:
        runs = runs_ref[0]
        # The whole process stalls (a long GC pause, a frozen VM): no heartbeat goes out, the
        # lease runs out and the reaper may take the run back. An await here would not do: the
        # worker's lease keeper would renew the lease of a step that only waits (ADRs/0023).
        time.sleep(ZOMBIE_PAUSE)  # noqa: ASYNC251 - blocking the event loop is the point
        for what in ("append_event", "end"):
            journal.write(event="stale-attempt", what=what, run=run.id, epoch=run.epoch)
            try:
                if what == "append_event":
                    await runs.append_event(run.fence, "zombie", {"holder": holder})
                else:
                    await runs.end(run.fence, TerminationReason.COMPLETED)
            except LeaseLost:
                continue
            journal.write(event="stale-accepted", what=what, run=run.id, epoch=run.epoch)
        # The worker's own boundary write (renew, then append) comes next: expected refused.
        journal.write(event="stale-attempt", what="boundary", run=run.id, epoch=run.epoch)

    policy = RunKindPolicy(name=KIND, lease=LEASE, backoff=BACKOFF, retry_budget=3)
    return RunKind(policy, steps)


EXECUTED = """
INSERT INTO fault_step_execution (id, run_id, name, occurrence, epoch, holder)
VALUES (%(id)s, %(run)s, %(name)s, %(occurrence)s, %(epoch)s, %(holder)s)
ON CONFLICT (id) DO NOTHING
"""


ANSWERED = """
INSERT INTO fault_wait_answer (id, run_id, epoch, signal_id, payload, holder)
VALUES (%(id)s, %(run)s, %(epoch)s, %(signal_id)s, %(payload)s, %(holder)s)
ON CONFLICT (id) DO NOTHING
"""


class Executions:
    """Counts step executions in ``fault_step_execution``, one autocommitted row each. A write
    cut off by a PostgreSQL restart is tried again under the same id until it is known to be
    in: a row whose commit was not acknowledged is not counted twice."""

    def __init__(self, url: str, size: int) -> None:
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            url, min_size=1, max_size=size, open=False, kwargs={"autocommit": True}
        )

    async def open(self) -> None:
        await self._pool.open()

    async def close(self) -> None:
        await self._pool.close()

    async def count(self, run: AgentRun, name: str, occurrence: int, holder: str) -> str:
        """Write the execution's row; returns its id."""
        row = {
            "id": uuid.uuid4(),
            "run": run.id,
            "name": name,
            "occurrence": occurrence,
            "epoch": run.epoch,
            "holder": holder,
        }
        await self._write(EXECUTED, row)
        return str(row["id"])

    async def answer(self, run: AgentRun, execution: str, answer: object, holder: str) -> None:
        """Write the wait's answer acted on by the execution ``execution`` (its row's id)."""
        signal_id = answer.get("signal_id") if isinstance(answer, dict) else None
        row = {
            "id": uuid.UUID(execution),
            "run": run.id,
            "epoch": run.epoch,
            "signal_id": None if signal_id is None else str(signal_id),
            "payload": Jsonb(answer),
            "holder": holder,
        }
        await self._write(ANSWERED, row)

    async def _write(self, sql: str, row: dict[str, object]) -> None:
        while True:
            try:
                async with self._pool.connection() as conn:
                    await conn.execute(sql, row)
                return
            except psycopg.OperationalError:
                await asyncio.sleep(0.1)


def recorded_kind(executions: Executions, journal: Journal, holder: str) -> RunKind:
    """The recorded workload: ``plan``, then ``call`` once per step of the script (the same
    name again: occurrences 1, 2, ...), then ``report``. A scripted failure comes after the
    first ``call``, so the retry replays ``plan`` and that ``call``; a zombie holder pauses
    inside the first ``call`` past its lease."""

    async def steps(run: AgentRun, ctx: StepContext) -> None:
        script = run.payload
        count = int(script.get("steps", 1))  # type: ignore[arg-type]
        pause = float(script.get("sleep", 0.01))  # type: ignore[arg-type]
        zombie = bool(script.get("zombie")) and run.epoch == 1
        seen: dict[str, int] = {}

        async def execute(name: str, stall: bool) -> dict[str, object]:
            seen[name] = occurrence = seen.get(name, 0) + 1
            execution = await executions.count(run, name, occurrence, holder)
            await asyncio.sleep(pause)
            if stall:
                # The lease runs out; the record that follows must be refused.
                journal.write(event="stale-attempt", what="record", run=run.id, epoch=run.epoch)
                time.sleep(ZOMBIE_PAUSE)  # noqa: ASYNC251 - the process stalls, as above
            return {"execution": execution, "epoch": run.epoch}

        async def step(name: str, stall: bool = False) -> object:
            if ctx.replaying:
                journal.write(event="replayed", run=run.id, name=name, epoch=run.epoch)
                # A replayed step does not run: its occurrence is counted here instead.
                seen[name] = seen.get(name, 0) + 1
            result = await ctx.step(name, execute, name, stall)
            if stall:
                journal.write(event="stale-accepted", what="record", run=run.id, epoch=run.epoch)
            return result

        await step("plan")
        for index in range(count):
            await step("call", stall=zombie and index == 0)
            fail = script.get("fail")
            if index == 0 and fail is not None and run.attempt < int(script.get("fail_until", 99)):  # type: ignore[arg-type]
                raise _failure(fail)
        await step("report")

    policy = RunKindPolicy(name=RECORDED_KIND, lease=LEASE, backoff=BACKOFF, retry_budget=3)
    return RunKind(policy, RecordedSteps(steps))


def waiting_kind(executions: Executions, journal: Journal, holder: str) -> RunKind:
    """The waits workload: ``plan``, a wait for ``go``, a durable sleep, then ``answer``, which
    writes the wait's answer to ``fault_wait_answer``. Every step counts its execution as the
    recorded workload's do."""

    async def steps(run: AgentRun, ctx: StepContext) -> None:
        pause = float(run.payload.get("sleep", 0.01))  # type: ignore[arg-type]

        async def execute(name: str, answer: object) -> dict[str, object]:
            execution = await executions.count(run, name, 1, holder)
            if name == "answer":
                await executions.answer(run, execution, answer, holder)
            await asyncio.sleep(pause)
            return {"execution": execution, "epoch": run.epoch}

        async def step(name: str, answer: object = None) -> None:
            if ctx.replaying:
                journal.write(event="replayed", run=run.id, name=name, epoch=run.epoch)
            await ctx.step(name, execute, name, answer)

        await step("plan")
        answer = await ctx.wait_for("go", timeout=WAIT_TIMEOUT)
        await ctx.sleep(WAIT_SLEEP)
        await step("answer", answer)

    # A kill costs the run an attempt, and a waiting run is leased three times: some room.
    policy = RunKindPolicy(name=WAITING_KIND, lease=LEASE, backoff=BACKOFF, retry_budget=5)
    return RunKind(policy, RecordedSteps(steps))


async def serve(args: argparse.Namespace) -> None:
    journal = Journal(Path(args.journal))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    stores = make_postgres_stores(args.url, None, pool_size=args.concurrency + 2)
    runs_ref: list[AgentRuns] = []
    # Two connections: a row is one short statement, and the server's connections are few.
    executions = Executions(args.url, 2)
    kinds = RunKinds(
        [
            fault_kind(runs_ref, journal, args.holder),
            recorded_kind(executions, journal, args.holder),
            waiting_kind(executions, journal, args.holder),
        ]
    )
    rng = random.Random(args.seed)
    runs = AgentRuns(stores, kinds, rng)
    runs_ref.append(runs)
    journal.write(event="started", role=args.role, holder=args.holder, pid=os.getpid())
    try:
        if args.role == "worker":
            await executions.open()
        if args.role == "reaper":
            reaper = AgentRunReaper(stores, kinds, rng, batch=200)
            await reaper.run(stop, every=args.every)
        else:
            worker = Worker(
                runs,
                kinds,
                stores.notifier,
                rng,
                holder=args.holder,
                concurrency=args.concurrency,
                poll_interval=0.5,
            )
            await worker.run(stop, grace=2.0)
            journal.write(
                event="stats",
                holder=args.holder,
                claimed=worker.stats.claimed,
                outcomes={str(k): v for k, v in worker.stats.outcomes.items()},
            )
    finally:
        await executions.close()
        await close_postgres_stores(stores)
        journal.write(event="stopped", role=args.role, holder=args.holder)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fault_worker")
    parser.add_argument("--url", required=True)
    parser.add_argument("--role", choices=["worker", "reaper"], default="worker")
    parser.add_argument("--holder", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--every", type=float, default=0.5, help="reaper tick, seconds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    # Failures are the point of this run: keep the log to what a person would look at.
    logging.basicConfig(level=logging.ERROR, format=f"{args.holder} %(levelname)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
