"""``python -m bench.levers``: how much the next levers on the worker loop could give, at most.

    .venv/bin/python -m bench.levers [--jobs 15000] [--rounds 2]

Drains the throughput bench's queue with the worker loop (1,024 slots) in variants that remove a
cost outright, next to raw SQL's batch of 10 on 8 connections, each on a fresh database of the
embedded server, interleaved ``--rounds`` times so the machine's drift moves them alike:

- **as benched**: the worker loop as ``make bench`` runs it (4 runs per subject, every index).
- **no promotions**: one run per subject, so no end promotes a subject's next run to head: the
  most that keeping a subject's head off the run row could save.
- **no console indexes**: the console's six partial indexes dropped before the drain: the most
  that moving ended runs (and their indexes) out of ``agent_run`` could save on the hot path.
- **both**: the two together.
- **+50 us client CPU**: as benched, with each step spinning 50 us in the worker's process. If
  the rate falls by about what that CPU costs on one core, the loop is bound by its process's
  one thread, and the client's CPU per run is the lever; if not, the server is.

A profile to rank levers by, not a bench with a target: run it alone and say the load average
with its figures. Nothing here changes the schema of a database a host uses.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg

from agentruns.app.kinds import StepEvent
from agentruns.domain.run import AgentRun
from bench.cpu_split import client_cpu, machine
from bench.server import BenchServer, bench_server
from bench.throughput import agentruns_runner, raw

# The console's read-model indexes (migration 0009): four on ended runs, two on queued.
CONSOLE_INDEXES = (
    "ix_agent_run_ended_seq",
    "ix_agent_run_ended_workspace",
    "ix_agent_run_ended_subject",
    "ix_agent_run_ended_unsuccessful",
    "ix_agent_run_queued_seq",
    "ix_agent_run_queued_console",
)

SPIN = 50e-6


async def spinning_step(run: AgentRun) -> AsyncIterator[StepEvent]:
    """The bench's one step, after 50 us of the process's own CPU."""
    until = time.perf_counter() + SPIN
    while time.perf_counter() < until:
        pass
    yield StepEvent("step", {})


Drain = Callable[[str], Awaitable[tuple[int, float]]]


async def measure(
    server: BenchServer, prepare: Callable[[str], Awaitable[None]], drain: Drain
) -> tuple[float, float, float]:
    """(runs/s, machine CPU us per run, the bench process's CPU us per run) of one drain."""
    url = server.create_database("levers")
    try:
        await prepare(url)
        before, ticks = client_cpu(), machine()
        done, seconds = await drain(url)
        client = client_cpu() - before
        total, idle = (now - then for now, then in zip(machine(), ticks, strict=True))
        busy = 1 - idle / max(total, 1)
        per = 1e6 / max(done, 1)
        return done / seconds, busy * (os.cpu_count() or 1) * seconds * per, client * per
    finally:
        server.drop_database(url)


def variants(jobs: int) -> dict[str, tuple[Callable[[str], Awaitable[None]], Drain]]:
    def loop(url: str) -> Awaitable[tuple[int, float]]:
        return agentruns_runner.drain_worker_loop(url, concurrency=1024)

    def spinning(url: str) -> Awaitable[tuple[int, float]]:
        return agentruns_runner.drain_worker_loop(url, concurrency=1024, step=spinning_step)

    def queue(*, per_subject: int, console: bool) -> Callable[[str], Awaitable[None]]:
        async def prepare(url: str) -> None:
            await agentruns_runner.prepare(url, jobs, runs_per_subject=per_subject)
            if not console:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                    for index in CONSOLE_INDEXES:
                        await conn.execute(f"DROP INDEX {index}")

        return prepare

    async def raw_prepare(url: str) -> None:
        await raw.prepare(url, jobs)

    return {
        "raw SQL, batch 10, 8 connections": (
            raw_prepare,
            lambda url: raw.drain(url, connections=8, batch=10),
        ),
        "worker loop, as benched": (
            queue(per_subject=agentruns_runner.RUNS_PER_SUBJECT, console=True),
            loop,
        ),
        "no promotions": (queue(per_subject=1, console=True), loop),
        "no console indexes": (
            queue(per_subject=agentruns_runner.RUNS_PER_SUBJECT, console=False),
            loop,
        ),
        "both": (queue(per_subject=1, console=False), loop),
        "+50 us client CPU per run": (
            queue(per_subject=agentruns_runner.RUNS_PER_SUBJECT, console=True),
            spinning,
        ),
    }


async def main_async(jobs: int, rounds: int) -> None:
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    measured: dict[str, list[tuple[float, float, float]]] = {}
    with bench_server() as server:
        for round in range(rounds):
            for name, (prepare, drain) in variants(jobs).items():
                figures = await measure(server, prepare, drain)
                measured.setdefault(name, []).append(figures)
                rate, cpu, client = figures
                print(
                    f"round {round + 1}: {name:34} {rate:7,.0f}/s  CPU {cpu:4.0f} us/run "
                    f"(process {client:3.0f})",
                    flush=True,
                )
    raw_rate = sorted(r for r, _, _ in measured["raw SQL, batch 10, 8 connections"])[rounds // 2]
    print(f"medians of {rounds} rounds; x raw = the median over raw SQL's median")
    for name, drains in measured.items():
        rate, cpu, client = (sorted(column)[rounds // 2] for column in zip(*drains, strict=True))
        print(
            f"  {name:34} {rate:7,.0f}/s  {rate / raw_rate:4.2f}x raw  "
            f"CPU {cpu:4.0f} us/run (process {client:3.0f})"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.levers", description=__doc__)
    parser.add_argument("--jobs", type=int, default=15_000, help="runs per drain (15,000)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (2)")
    args = parser.parse_args(argv)
    asyncio.run(main_async(args.jobs, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
