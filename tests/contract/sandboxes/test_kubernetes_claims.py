"""What only the Kubernetes adapter shows: the requests it sends and the failures it translates."""

from __future__ import annotations

import kmock
import pytest

from agentruns.adapters.kubernetes.claims import KubernetesSandboxClaims, gateway_url_of
from agentruns.app.sandboxes import claim_name_of as claim_name
from agentruns.domain.errors import SandboxError
from tests.contract.sandboxes.emulator import NAMESPACE, client_for, emulated_cluster
from tests.contract.sandboxes.test_claims_contract import SANDBOX_ID, spec


async def test_claims_go_to_the_namespace_and_the_list_asks_for_the_label() -> None:
    """The adapter writes into its namespace and lets the API server filter by the label."""
    async with emulated_cluster() as cluster:
        await cluster.claims.create(spec())
        await cluster.claims.list_labelled()
        requests = list(cluster.emulator)
        create, listing = requests[-2], requests[-1]
        assert create.method == kmock.method.POST
        assert create.namespace == NAMESPACE
        assert create.data["metadata"]["name"] == claim_name(SANDBOX_ID)
        assert listing.action == kmock.action.LIST
        assert listing.params["labelSelector"] == "agentruns.io/sandbox-id"
        assert create.headers["Authorization"] == "Bearer test-token"


async def test_an_unreachable_api_is_a_sandbox_error() -> None:
    """A connection refused on every call surfaces as SandboxError, not a transport error."""
    client = client_for("http://127.0.0.1:9")
    claims = KubernetesSandboxClaims(client, NAMESPACE)
    try:
        with pytest.raises(SandboxError):
            await claims.create(spec())
        with pytest.raises(SandboxError):
            await claims.delete("sbx-x")
        with pytest.raises(SandboxError):
            await claims.list_labelled()
    finally:
        await client.close()


def _service(cluster_ip: str, ports: list[int]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "gateway", "namespace": "agentruns"},
        "spec": {"clusterIP": cluster_ip, "ports": [{"port": port} for port in ports]},
    }


async def test_the_gateway_service_resolves_to_its_cluster_ip() -> None:
    """A sandbox has no DNS: the server reads the Service and hands on its address."""
    async with emulated_cluster() as cluster:
        services = kmock.resource("v1/services")
        cluster.emulator.objects[services, "agentruns", "gateway"] = _service("10.0.0.7", [8081])
        cluster.emulator.objects[services, "agentruns", "v6"] = {
            **_service("fd00::7", [8081]),
            "metadata": {"name": "v6", "namespace": "agentruns"},
        }
        client = cluster.client
        assert await gateway_url_of(client, "gateway", "agentruns", port=8081) == (
            "http://10.0.0.7:8081"
        )
        assert await gateway_url_of(client, "v6", "agentruns", port=8081) == "http://[fd00::7]:8081"
        with pytest.raises(SandboxError):
            await gateway_url_of(client, "gateway", "agentruns", port=9999)
        with pytest.raises(SandboxError):
            await gateway_url_of(client, "missing", "agentruns", port=8081)


async def test_a_headless_gateway_service_is_refused() -> None:
    """A Service without a cluster IP gives a sandbox no address to call."""
    async with emulated_cluster() as cluster:
        services = kmock.resource("v1/services")
        cluster.emulator.objects[services, "agentruns", "gateway"] = _service("None", [8081])
        with pytest.raises(SandboxError, match="cluster IP"):
            await gateway_url_of(cluster.client, "gateway", "agentruns", port=8081)
