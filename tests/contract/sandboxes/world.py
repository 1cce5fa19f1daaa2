"""A sandbox world for the tests: runs, sandbox rows, a cluster, tokens, the use cases."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.memory import MemoryFamily
from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.adapters.postgres.database import PostgresDatabase
from agentruns.adapters.postgres.sandboxes import PostgresSandboxStore
from agentruns.adapters.tokens import JwtSandboxTokens, SigningKey
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.ports import Stores
from agentruns.app.runs import AgentRuns
from agentruns.app.sandbox_ports import SandboxStore
from agentruns.app.sandbox_reaper import AgentSandboxReaper
from agentruns.app.sandboxes import AgentSandboxes, AgentSandboxKind
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.sandbox import AgentSandbox
from tests.contract.kinds import scripted_steps
from tests.contract.sandboxes.harness import Cluster, cluster_of

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GATEWAY_URL = "http://10.0.0.7:8081"
KEY = SigningKey("k1", b"k" * 32, not_before=START, not_after=START + timedelta(days=7))

CODER = AgentSandboxKind("coder", runs=("code",), warm_pool="coder-pool")
TALKER = AgentSandboxKind("talker", runs=("chat",), warm_pool="talker-pool", conversation=True)
REVIEWER = AgentSandboxKind("reviewer", runs=(), warm_pool="reviewer-pool")

STORE_FAMILIES = ["memory", "postgres"]


@dataclass
class World:
    clock: ManualClock
    stores: Stores
    store: SandboxStore
    cluster: Cluster
    tokens: JwtSandboxTokens
    runs: AgentRuns
    sandboxes: AgentSandboxes
    reaper: AgentSandboxReaper
    ids: list[UUID]

    async def token_of(self, sandbox: AgentSandbox) -> str:
        """The token the sandbox's claim carries, as the sandbox reads it from its env."""
        body = self.cluster.body(sandbox.claim_name)
        assert body is not None, f"no claim {sandbox.claim_name}"
        env = {item["name"]: item["value"] for item in body["spec"]["env"]}
        return str(env["AGENTRUNS_SANDBOX_TOKEN"])

    async def row(self, sandbox_id: UUID) -> AgentSandbox | None:
        return await self.sandboxes.get(sandbox_id)


def run_kinds() -> RunKinds:
    def kind(name: str) -> RunKind:
        return RunKind(RunKindPolicy(name=name, lease=timedelta(seconds=30)), scripted_steps)

    return RunKinds([kind("code"), kind("chat"), kind("review")])


@asynccontextmanager
async def stores_of(
    family: str, clock: ManualClock, postgres_url: str | None
) -> AsyncIterator[tuple[Stores, SandboxStore]]:
    """The run stores and the sandbox store of one family, sharing one transaction scope."""
    if family == "memory":
        memory = MemoryFamily(clock)
        yield memory.stores, memory.sandboxes
    elif family == "postgres" and postgres_url is not None:
        stores = make_postgres_stores(postgres_url, clock)
        assert isinstance(stores.scope, PostgresDatabase)
        try:
            yield stores, PostgresSandboxStore(stores.scope)
        finally:
            await close_postgres_stores(stores)
    else:  # pragma: no cover - each store family adds its branch
        raise AssertionError(f"unknown store family {family}")


@asynccontextmanager
async def world_of(
    family: str, cluster_family: str, postgres_url: str | None = None
) -> AsyncIterator[World]:
    clock = ManualClock(START)
    ids = [UUID(int=n) for n in range(1, 1000)]
    handed: list[UUID] = []

    def new_id() -> UUID:
        handed.append(ids[len(handed)])
        return handed[-1]

    async with (
        stores_of(family, clock, postgres_url) as (stores, store),
        cluster_of(cluster_family) as cluster,
    ):
        tokens = JwtSandboxTokens([KEY], clock)
        runs = AgentRuns(stores, run_kinds(), random.Random(3))
        sandboxes = AgentSandboxes(
            stores.scope,
            store,
            cluster.claims,
            tokens,
            [CODER, TALKER, REVIEWER],
            gateway_url=GATEWAY_URL,
            new_id=new_id,
        )
        reaper = AgentSandboxReaper(stores.scope, store, cluster.claims)
        yield World(clock, stores, store, cluster, tokens, runs, sandboxes, reaper, ids)
