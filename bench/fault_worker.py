"""A worker or reaper process of the fault run: ``python -m bench.fault_worker``.

``--role worker`` runs ``Worker.run`` for the ``fault`` kind until SIGTERM; ``--role reaper``
runs ``AgentRunReaper.run``. The kind's steps read their script from the payload (how many steps,
how long each sleeps, how and until which attempt they fail, whether the holder turns zombie).

A zombie holder pauses past its lease, then tries to write under its old fence: an explicit
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
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.backoff import Backoff
from agentruns.domain.errors import LeaseLost
from agentruns.domain.failures import FallbackChainExhausted, ProviderError
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import TerminationReason

KIND = "fault"
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
        await asyncio.sleep(ZOMBIE_PAUSE)  # the lease runs out; the reaper may take it back
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


async def serve(args: argparse.Namespace) -> None:
    journal = Journal(Path(args.journal))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    stores = make_postgres_stores(args.url, None, pool_size=args.concurrency + 2)
    runs_ref: list[AgentRuns] = []
    kinds = RunKinds([fault_kind(runs_ref, journal, args.holder)])
    rng = random.Random(args.seed)
    runs = AgentRuns(stores, kinds, rng)
    runs_ref.append(runs)
    journal.write(event="started", role=args.role, holder=args.holder, pid=os.getpid())
    try:
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
