"""Sandbox tests run over every store family and over both clusters (memory, local API)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.contract.sandboxes.harness import CLUSTERS
from tests.contract.sandboxes.world import STORE_FAMILIES, World, world_of

# The memory store over both clusters; every other store over the real client and the local API
# (the cluster adapters' own contract suite already runs each cluster on its own).
WORLDS = [("memory", cluster) for cluster in CLUSTERS] + [
    (family, "kubernetes") for family in STORE_FAMILIES if family != "memory"
]


@pytest.fixture(params=WORLDS, ids=["-".join(world) for world in WORLDS])
async def world(request: pytest.FixtureRequest) -> AsyncIterator[World]:
    family, cluster = request.param
    # Only a PostgreSQL world asks for the server, so a memory-only run never starts it.
    url = request.getfixturevalue("postgres_url") if family == "postgres" else None
    async with world_of(family, cluster, url) as world:
        yield world
