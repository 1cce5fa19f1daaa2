"""A local Kubernetes API over real HTTP on 127.0.0.1, for the Kubernetes adapter's tests.

The emulator keeps objects in memory and answers as the API server does. One addition: an
object whose name is in ``refused_deletes`` cannot be deleted (403), as under an RBAC rule or an
admission webhook, so the reaper's "a claim the API refuses stays" has a real HTTP answer to meet.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp.web
import attrs
import kmock
from lightkube import AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User

from agentruns.adapters.kubernetes.claims import KubernetesSandboxClaims
from agentruns.adapters.kubernetes.manifest import GROUP, PLURAL, VERSION

NAMESPACE = "sandboxes"
CLAIMS = kmock.resource(f"{GROUP}/{VERSION}/{PLURAL}")


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    refused_deletes: set[str] = attrs.field(factory=set)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.action == kmock.action.DELETE and request.name in self.refused_deletes:
            refusal = kmock.KubernetesError(status=403, reason="Forbidden", message="refused")
            return await self._render_error(refusal)
        return await super()._handle(request)

    def live(self) -> dict[str, dict[str, Any]]:
        """The claims that exist, by name."""
        return {
            name: obj.raw
            for (resource, _, name), obj in self.objects.items()
            if resource == CLAIMS and not obj.deleted
        }


class EmulatedCluster:
    """The emulator, the real lightkube client that talks to it, and the adapter over both."""

    def __init__(self, emulator: ClusterEmulator, client: AsyncClient) -> None:
        self.emulator = emulator
        self.client = client
        self.claims = KubernetesSandboxClaims(client, NAMESPACE)

    def body(self, name: str) -> dict[str, Any] | None:
        return self.emulator.live().get(name)

    def names(self) -> set[str]:
        return set(self.emulator.live())

    def add_foreign(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.emulator.objects[CLAIMS, NAMESPACE, name] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxClaim",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(labels or {})},
            "spec": {"warmPoolRef": {"name": "elsewhere"}},
        }

    def refuse_delete(self, name: str) -> None:
        self.emulator.refused_deletes.add(name)

    def allow_delete(self, name: str) -> None:
        self.emulator.refused_deletes.discard(name)


def client_for(url: str) -> AsyncClient:
    config = KubeConfig.from_one(
        cluster=Cluster(server=url), user=User(token="test-token"), namespace=NAMESPACE
    )
    return AsyncClient(config)


@asynccontextmanager
async def emulated_cluster() -> AsyncIterator[EmulatedCluster]:
    async with ClusterEmulator() as emulator, kmock.Server(emulator, host="127.0.0.1") as server:
        emulator.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock.ResourceInfo(
            kind="SandboxClaim", namespaced=True
        )
        client = client_for(str(server.url))
        try:
            yield EmulatedCluster(emulator, client)
        finally:
            await client.close()
