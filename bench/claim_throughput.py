"""Claim-and-settle throughput of the PostgreSQL stores: no-op runs, several connections.

    .venv/bin/python -m bench.claim_throughput [--workspaces 10] [--batch 10] [--claimers 8]

Fills a fresh database with 20,000 queued runs (one per subject), then each claimer loops: one
transaction claims up to ``batch`` runs, a second ends them all under their fences. Reports runs
settled per second over the whole drain. A benchmark, not a test: the figure depends on the
machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import psycopg

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.app.ports import ClaimRequest
from agentruns.domain.termination import TerminationReason
from bench.population import populate
from tests.postgres_server import cloned_database, create_template, server_url

RUNS = 20_000


async def drain(url: str, batch: int, claimers: int) -> float:
    stores = make_postgres_stores(url, pool_size=claimers)
    settled = 0

    async def claimer(name: str) -> None:
        nonlocal settled
        while True:
            async with stores.scope.transaction() as tx:
                runs = await stores.runs.claim(tx, ClaimRequest(holder=name, limit=batch))
            if not runs:
                return
            async with stores.scope.transaction() as tx:
                for run in runs:
                    await stores.runs.end(tx, run.id, TerminationReason.COMPLETED, run.fence)
            settled += len(runs)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(claimer(f"c{index}") for index in range(claimers)))
    finally:
        await close_postgres_stores(stores)
    elapsed = time.perf_counter() - started
    assert settled == RUNS, settled
    return settled / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspaces", type=int, default=10)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--claimers", type=int, default=8)
    options = parser.parse_args()
    with server_url() as server:
        create_template(server)
        with cloned_database(server) as url:
            with psycopg.connect(url, autocommit=True) as connection:
                populate(connection, queued=RUNS, workspaces=options.workspaces, subjects=RUNS)
            rate = asyncio.run(drain(url, options.batch, options.claimers))
    print(
        f"workspaces={options.workspaces} batch={options.batch} claimers={options.claimers}: "
        f"{rate:,.0f} runs/s claimed and settled",
        flush=True,
    )


if __name__ == "__main__":
    main()
