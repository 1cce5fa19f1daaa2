"""One cluster harness per claims adapter: the contract suite runs the same tests over each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from agentruns.adapters.memory.sandbox_claims import MemorySandboxClaims
from agentruns.app.sandbox_ports import SandboxClaims
from tests.contract.sandboxes.emulator import emulated_cluster


class Cluster(Protocol):
    """What a test sees of a cluster: its adapter, the bodies it holds, and two test knobs."""

    @property
    def claims(self) -> SandboxClaims: ...

    def body(self, name: str) -> dict[str, Any] | None: ...

    def names(self) -> set[str]: ...

    def add_foreign(self, name: str, labels: dict[str, str] | None = None) -> None: ...

    def refuse_delete(self, name: str) -> None: ...

    def allow_delete(self, name: str) -> None: ...


class MemoryCluster:
    def __init__(self) -> None:
        self.claims = MemorySandboxClaims()

    def body(self, name: str) -> dict[str, Any] | None:
        return self.claims.body(name)

    def names(self) -> set[str]:
        return set(self.claims.bodies)

    def add_foreign(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.claims.add_foreign(name, labels)

    def refuse_delete(self, name: str) -> None:
        self.claims.refused_deletes.add(name)

    def allow_delete(self, name: str) -> None:
        self.claims.refused_deletes.discard(name)


@asynccontextmanager
async def cluster_of(family: str) -> AsyncIterator[Cluster]:
    if family == "memory":
        yield MemoryCluster()
    else:
        async with emulated_cluster() as cluster:
            yield cluster


CLUSTERS = ["memory", "kubernetes"]
