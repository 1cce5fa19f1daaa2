"""The container's PostgreSQL profile: stores on the settings' database URL, the database clock."""

from __future__ import annotations

import pytest
from dependency_injector import providers

from agentruns.adapters.postgres import PostgresDatabase, close_postgres_stores
from agentruns.app.kinds import RunKind
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.states import AgentRunState
from agentruns.entrypoints.container import AgentRunsContainer
from agentruns.entrypoints.settings import AgentRunsSettings
from tests.contract.kinds import scripted_steps


async def test_the_postgres_profile_enqueues_and_claims_on_the_database(postgres_url: str) -> None:
    container = AgentRunsContainer()
    container.profile.override(providers.Object("postgres"))
    container.settings.override(
        providers.Object(AgentRunsSettings(database_url=postgres_url, worker_concurrency=6))
    )
    container.kinds().register(RunKind(RunKindPolicy(name="chat"), scripted_steps))
    stores = container.stores()
    assert isinstance(stores.scope, PostgresDatabase)
    assert stores.scope.clock is None  # time is the database's
    assert stores.scope.engine.pool.size() == 8  # type: ignore[attr-defined]
    try:
        runs = container.runs()
        run = await runs.enqueue("chat", workspace="acme", subject="s")
        [claimed] = await runs.claim("w")
        assert (claimed.id, claimed.state) == (run.id, AgentRunState.LEASED)
    finally:
        await close_postgres_stores(stores)


def test_the_postgres_profile_without_a_url_is_refused_clearly() -> None:
    container = AgentRunsContainer()
    container.profile.override(providers.Object("postgres"))
    container.settings.override(providers.Object(AgentRunsSettings(database_url=None)))
    with pytest.raises(ValueError, match="AGENTRUNS_DATABASE_URL"):
        container.stores()
