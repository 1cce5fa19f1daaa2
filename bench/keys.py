"""Enqueue throughput with an enqueue key against without (issue 25: at least 0.9x).

    .venv/bin/python -m bench.keys [--rounds 6] [--enqueues 4000] [--concurrency 8] [--no-results]

One migrated database on the embedded server (or AGENTRUNS_TEST_DATABASE_URL's server), one
AgentRuns over one pool, as a host's web process holds it. Rounds alternate between the two
contenders (plain, keyed, plain, keyed, ...), so drift in the machine touches both alike; each
round enqueues ``--enqueues`` runs from ``--concurrency`` tasks, every run on a subject of its
own and, when keyed, under a key of its own (the path a host pays on every new piece of work: the
key is taken and the run inserted in one statement). Reports each round's runs/s, the medians and
the ratio keyed / plain; the section ``keys`` of ``bench/RESULTS.md`` is rewritten unless
``--no-results``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import time
from collections.abc import Iterator
from datetime import UTC, datetime

from agentruns.adapters.postgres import PostgresFamily
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.runs import AgentRuns
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from bench.results import table, write_section
from tests.postgres_server import cloned_database, create_template, server_url


async def _no_steps(run: AgentRun) -> None:
    """Never driven: the bench only enqueues."""


KINDS = RunKinds([RunKind(RunKindPolicy(name="chat"), _no_steps)])  # type: ignore[arg-type]


async def _round(
    runs: AgentRuns, keyed: bool, enqueues: int, concurrency: int, numbers: Iterator[int]
) -> float:
    """Runs per second of one round."""
    left = enqueues

    async def enqueuer() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            number = next(numbers)
            await runs.enqueue(
                "chat",
                workspace=f"ws-{number % 50}",
                subject=f"s-{number}",
                payload={"message": number},
                key=f"webhook-{number}" if keyed else None,
            )

    started = time.perf_counter()
    await asyncio.gather(*(enqueuer() for _ in range(concurrency)))
    return enqueues / (time.perf_counter() - started)


async def measure(url: str, rounds: int, enqueues: int, concurrency: int) -> tuple[float, float]:
    family = PostgresFamily(url, pool_size=concurrency)
    runs = AgentRuns(family.stores, KINDS, random.Random(1))
    numbers = itertools.count()
    try:
        # A warm-up round of each: the pool, the plans and the caches are filled.
        for keyed in (False, True):
            await _round(runs, keyed, max(enqueues // 10, 1), concurrency, numbers)
        rates: dict[bool, list[float]] = {False: [], True: []}
        for index in range(rounds):
            for keyed in (False, True) if index % 2 == 0 else (True, False):
                rate = await _round(runs, keyed, enqueues, concurrency, numbers)
                rates[keyed].append(rate)
                label = "keyed" if keyed else "plain"
                print(f"round {index + 1:>2} {label:<5} {rate:9.0f} runs/s", flush=True)
    finally:
        await family.close()
    plain, keyed_rate = (statistics.median(rates[flag]) for flag in (False, True))
    print(f"median plain {plain:9.0f} runs/s")
    print(f"median keyed {keyed_rate:9.0f} runs/s")
    print(f"keyed / plain {keyed_rate / plain:.2f}x (target >= 0.90x)")
    return plain, keyed_rate


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.keys", description=__doc__)
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each contender")
    parser.add_argument("--enqueues", type=int, default=4000, help="enqueues per round")
    parser.add_argument("--concurrency", type=int, default=8, help="enqueuing tasks (and pool)")
    parser.add_argument("--no-results", action="store_true", help="leave bench/RESULTS.md")
    options = parser.parse_args()
    started = datetime.now(UTC)
    with server_url() as server:
        create_template(server)
        with cloned_database(server) as url:
            plain, keyed = asyncio.run(
                measure(url, options.rounds, options.enqueues, options.concurrency)
            )
    text = table(
        "## Enqueue keys (`python -m bench.keys`)",
        started,
        [
            f"| enqueue with a key vs without (enqueue throughput; {options.rounds} alternating "
            f"rounds of {options.enqueues:,} enqueues from {options.concurrency} tasks, each run "
            f"on a subject and under a key of its own) | ≥ 0.9x | **{keyed / plain:.2f}x** "
            f"({keyed:,.0f} vs {plain:,.0f} runs/s) |"
        ],
    )
    print(text)
    if not options.no_results:
        write_section("keys", text)


if __name__ == "__main__":
    main()
