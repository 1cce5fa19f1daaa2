"""The claims contract, over the memory adapter and the Kubernetes adapter on a local API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from uuid import UUID

import jsonschema
import pytest

from agentruns.app.sandbox_ports import SANDBOX_ID_LABEL, SandboxClaimRef, SandboxClaimSpec
from agentruns.app.sandboxes import claim_name_of as claim_name
from agentruns.domain.errors import SandboxError
from tests.contract.sandboxes.harness import CLUSTERS, Cluster, cluster_of
from tests.contract.sandboxes.schema import SANDBOX_CLAIM_V1BETA1
from tests.strategies import EPOCH

SANDBOX_ID = UUID("0b7c5d4e-1f2a-4b3c-8d9e-0a1b2c3d4e5f")


def spec(sandbox_id: UUID = SANDBOX_ID) -> SandboxClaimSpec:
    return SandboxClaimSpec(
        name=claim_name(sandbox_id),
        sandbox_id=sandbox_id,
        warm_pool="coder-pool",
        shutdown_at=EPOCH + timedelta(hours=1, microseconds=500),
        token="header.payload.signature",
        gateway_url="http://10.0.0.7:8081",
    )


@pytest.fixture(params=CLUSTERS)
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    async with cluster_of(request.param) as cluster:
        yield cluster


async def test_a_created_claim_has_the_body_the_controller_expects(cluster: Cluster) -> None:
    """Named sbx-<hex>, labelled, drawing from the kind's pool, shut down at shutdown, with env."""
    await cluster.claims.create(spec())
    body = cluster.body("sbx-0b7c5d4e1f2a4b3c8d9e0a1b2c3d4e5f")
    assert body is not None
    assert body["metadata"]["labels"] == {SANDBOX_ID_LABEL: str(SANDBOX_ID)}
    assert body["spec"] == {
        "warmPoolRef": {"name": "coder-pool"},
        "lifecycle": {"shutdownTime": "2026-01-01T01:00:00Z", "shutdownPolicy": "Delete"},
        "env": [
            {"name": "AGENTRUNS_SANDBOX_TOKEN", "value": "header.payload.signature"},
            {"name": "AGENTRUNS_GATEWAY_URL", "value": "http://10.0.0.7:8081"},
        ],
    }


async def test_claim_bodies_validate_against_the_v1beta1_schema(cluster: Cluster) -> None:
    """What either adapter writes is a valid SandboxClaim v1beta1."""
    for n in range(3):
        await cluster.claims.create(spec(UUID(int=n + 1)))
    for name in cluster.names():
        body = cluster.body(name)
        assert body is not None
        jsonschema.validate(body, SANDBOX_CLAIM_V1BETA1)


def test_the_schema_refuses_what_the_controller_would() -> None:
    """The test schema is not vacuous: a claim without its pool, or a bad name, fails it."""
    good = {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": "sbx-1"},
        "spec": {"warmPoolRef": {"name": "p"}},
    }
    jsonschema.validate(good, SANDBOX_CLAIM_V1BETA1)
    for bad in (
        {**good, "spec": {}},
        {**good, "metadata": {"name": "Sbx_1"}},
        {**good, "metadata": {"name": "s" * 64}},
        {**good, "spec": {"warmPoolRef": {"name": "p"}, "lifecycle": {"shutdownTime": "soon"}}},
        {**good, "spec": {"warmPoolRef": {"name": "p"}, "env": [{"name": "X", "value": 1}]}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SANDBOX_CLAIM_V1BETA1)


async def test_a_claim_name_is_created_once(cluster: Cluster) -> None:
    """A second claim of the same name is refused as a SandboxError."""
    await cluster.claims.create(spec())
    with pytest.raises(SandboxError):
        await cluster.claims.create(spec())


async def test_delete_removes_the_claim_and_a_gone_claim_counts_as_deleted(
    cluster: Cluster,
) -> None:
    """Deleting twice succeeds twice: a 404 is what the caller wanted."""
    await cluster.claims.create(spec())
    await cluster.claims.delete(claim_name(SANDBOX_ID))
    assert cluster.names() == set()
    await cluster.claims.delete(claim_name(SANDBOX_ID))


async def test_a_delete_the_api_refuses_raises_and_the_claim_stays(cluster: Cluster) -> None:
    """A refused delete is a SandboxError and leaves the claim for the next pass."""
    await cluster.claims.create(spec())
    cluster.refuse_delete(claim_name(SANDBOX_ID))
    with pytest.raises(SandboxError):
        await cluster.claims.delete(claim_name(SANDBOX_ID))
    assert cluster.names() == {claim_name(SANDBOX_ID)}
    cluster.allow_delete(claim_name(SANDBOX_ID))
    await cluster.claims.delete(claim_name(SANDBOX_ID))
    assert cluster.names() == set()


async def test_the_labelled_list_holds_ours_and_no_foreign_claim(cluster: Cluster) -> None:
    """Claims without agentruns' label (an isolation gate's) never appear in the list."""
    await cluster.claims.create(spec())
    cluster.add_foreign("gate-1")
    cluster.add_foreign("other-labels", {"team": "x"})
    cluster.add_foreign("orphan", {SANDBOX_ID_LABEL: "gone"})
    listed = sorted(await cluster.claims.list_labelled(), key=lambda ref: ref.name)
    assert listed == [
        SandboxClaimRef(name="orphan", sandbox_id="gone"),
        SandboxClaimRef(name=claim_name(SANDBOX_ID), sandbox_id=str(SANDBOX_ID)),
    ]
