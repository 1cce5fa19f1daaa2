"""The pytest plugin of ``agentruns.testing`` (loaded by pytest itself when agentruns is installed).

Fixtures, each named ``agentruns_*``:

``agentruns_harness``
    A factory, ``agentruns_harness(*kinds, seed=0, start=None, schedules=())``, of harnesses
    on this test's adapter; the test runs once in memory and once on PostgreSQL (``[memory]``,
    ``[postgres]``).
    Harnesses are closed after the test.
``agentruns_adapter``
    ``"memory"`` or ``"postgres"``: the parameter ``agentruns_harness`` runs over.
``agentruns_database_url``
    A fresh database for this test, cloned from a template migrated with agentruns' schema and
    then ``agentruns_migrations``; dropped after the test.
``agentruns_migrations``
    The host's own :class:`~agentruns.MigrationChain` s, applied after agentruns' schema: none by
    default; override it in a ``conftest.py`` (session scope).
``agentruns_server``
    The session's :class:`~agentruns.testing.postgres.PostgresTestServer`: the server
    ``AGENTRUNS_TEST_DATABASE_URL`` names, else an embedded one, started on first use.

Async fixtures and tests need pytest-asyncio (the ``testing`` extra) with
``asyncio_mode = "auto"`` and ``asyncio_default_fixture_loop_scope = "function"`` (the loop
scope of the kit's fixtures; unset, pytest-asyncio warns) in the host's pytest configuration.
Importing this module imports
nothing of agentruns but what a fixture in use needs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeAlias, cast

import pytest

if TYPE_CHECKING:
    from agentruns.adapters.postgres.migrate import MigrationChain
    from agentruns.app.kinds import RunKind
    from agentruns.domain.schedule import Schedule
    from agentruns.testing._harness import AgentRunsHarness, HarnessFactory
    from agentruns.testing.postgres import PostgresTestServer

ADAPTERS = ("memory", "postgres")


@pytest.fixture(scope="session")
def agentruns_server() -> Iterator[PostgresTestServer]:
    from agentruns.testing.postgres import PostgresTestServer

    with PostgresTestServer.start() as server:
        try:
            yield server
        finally:
            server.drop_templates()


@pytest.fixture(scope="session")
def agentruns_migrations() -> Sequence[MigrationChain]:
    return ()


@pytest.fixture
def agentruns_database_url(
    agentruns_server: PostgresTestServer, agentruns_migrations: Sequence[MigrationChain]
) -> Iterator[str]:
    with agentruns_server.database(agentruns_migrations) as url:
        yield url


@pytest.fixture(params=ADAPTERS)
def agentruns_adapter(request: pytest.FixtureRequest) -> str:
    adapter: str = request.param
    return adapter


def _factory(url: str | None, made: list[AgentRunsHarness]) -> HarnessFactory:
    from agentruns.testing._harness import harness

    def make(
        *kinds: RunKind,
        seed: int = 0,
        start: datetime | None = None,
        schedules: Sequence[Schedule] = (),
    ) -> AgentRunsHarness:
        built = harness(*kinds, seed=seed, start=start, database_url=url, schedules=schedules)
        made.append(built)
        return built

    return make


_HarnessFixture: TypeAlias = Callable[[str, pytest.FixtureRequest], AsyncIterator["HarnessFactory"]]


def _needs_pytest_asyncio(function: _HarnessFixture) -> _HarnessFixture:
    """Without pytest-asyncio, the async fixture is one that says what to install."""

    def missing() -> None:
        raise RuntimeError(
            f"{function.__name__} needs pytest-asyncio: pip install 'agentruns[testing]'"
        )

    return cast(_HarnessFixture, pytest.fixture(name=function.__name__)(missing))


# pytest-asyncio's fixture decorator, or one whose fixture says pytest-asyncio is missing.
_async_fixture: Callable[[_HarnessFixture], _HarnessFixture]
try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - the dev install has it
    _async_fixture = _needs_pytest_asyncio
else:
    _async_fixture = cast(
        Callable[[_HarnessFixture], _HarnessFixture], pytest_asyncio.fixture(loop_scope="function")
    )


@_async_fixture
async def agentruns_harness(
    agentruns_adapter: str, request: pytest.FixtureRequest
) -> AsyncIterator[HarnessFactory]:
    url: str | None = None
    if agentruns_adapter == "postgres":
        # Only a PostgreSQL test asks for the server, so a memory-only run never starts it.
        url = request.getfixturevalue("agentruns_database_url")
    made: list[AgentRunsHarness] = []
    try:
        yield _factory(url, made)
    finally:
        for built in made:
            await built.close()
