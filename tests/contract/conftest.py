"""The contract suite's backends: every test here runs on each adapter family in BACKENDS."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.memory import MemoryFamily
from agentruns.adapters.postgres import PostgresFamily
from agentruns.adapters.postgres.connections import ConnectionOptions
from agentruns.app.family import AdapterFamily
from agentruns.app.kinds import RunKinds
from agentruns.app.ports import Stores
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.testing import PostgresTestServer
from examples.review import ReviewJobs, review_jobs
from tests.contract.kinds import contract_kinds

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

BACKENDS = ["memory", "postgres"]


@dataclass
class Backend:
    """One adapter family under test, on a manual clock."""

    name: str
    clock: ManualClock
    family: AdapterFamily
    review_jobs: ReviewJobs

    @property
    def stores(self) -> Stores:
        return self.family.stores


def memory_backend(clock: ManualClock) -> Backend:
    family = MemoryFamily(clock)
    return Backend("memory", clock, family, review_jobs(family))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def rng() -> random.Random:
    return random.Random(7)


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, clock: ManualClock) -> AsyncIterator[Backend]:
    if request.param == "memory":
        yield memory_backend(clock)
    elif request.param == "postgres":
        # Only a PostgreSQL test asks for the server, so a memory-only run never starts it.
        url: str = request.getfixturevalue("postgres_url")
        server: PostgresTestServer = request.getfixturevalue("agentruns_server")
        # Through a transaction pooler, wake-ups listen on a direct connection.
        listen = server.direct_url(url)
        options = None if listen is None else ConnectionOptions(listen_url=listen)
        family = PostgresFamily(url, clock, options=options)
        try:
            yield Backend("postgres", clock, family, review_jobs(family))
        finally:
            await family.close()
    else:  # pragma: no cover - each family adds its branch
        raise AssertionError(f"unknown backend {request.param}")


@pytest.fixture
def kinds(backend: Backend) -> RunKinds:
    return contract_kinds(backend.review_jobs)


@pytest.fixture
def runs(backend: Backend, kinds: RunKinds, rng: random.Random) -> AgentRuns:
    return AgentRuns(backend.stores, kinds, rng)


@pytest.fixture
def reaper(backend: Backend, kinds: RunKinds, rng: random.Random) -> AgentRunReaper:
    return AgentRunReaper(backend.stores, kinds, rng)


@pytest.fixture
def worker(backend: Backend, runs: AgentRuns, kinds: RunKinds, rng: random.Random) -> Worker:
    return Worker(runs, kinds, backend.stores.notifier, rng, holder="worker-1", poll_interval=0.05)
