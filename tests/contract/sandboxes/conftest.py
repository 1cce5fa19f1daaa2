"""Sandbox tests run over every store family and over both clusters (memory, local API)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.contract.sandboxes.harness import CLUSTERS
from tests.contract.sandboxes.world import STORE_FAMILIES, World, world_of


@pytest.fixture(
    params=[(f, c) for f in STORE_FAMILIES for c in CLUSTERS], ids=lambda p: "-".join(p)
)
async def world(request: pytest.FixtureRequest) -> AsyncIterator[World]:
    family, cluster = request.param
    # Only a PostgreSQL world asks for the server, so a memory-only run never starts it.
    url = request.getfixturevalue("postgres_url") if family == "postgres" else None
    async with world_of(family, cluster, url) as world:
        yield world
