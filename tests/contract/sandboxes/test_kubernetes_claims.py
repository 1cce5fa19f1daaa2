"""What only the Kubernetes adapter shows: the requests it sends and the failures it translates."""

from __future__ import annotations

import kmock
import pytest

from agentruns.adapters.kubernetes.claims import KubernetesSandboxClaims
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
