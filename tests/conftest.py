"""Test-wide settings: hypothesis profiles (``HYPOTHESIS_PROFILE=ci`` in CI), and PostgreSQL.

PostgreSQL comes from agentruns' own pytest plugin (``agentruns.testing.plugin``), as a host's
tests get it: one server per session (embedded unless ``AGENTRUNS_TEST_DATABASE_URL`` names
one), started only when a test asks for it. ``postgres_url`` is a database of one test's own,
cloned from a template migrated with agentruns' schema and the review example's chain.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings

from agentruns.adapters.postgres.migrate import MigrationChain
from agentruns.testing import PostgresTestServer
from tests.postgres_server import CHAINS

settings.register_profile("dev", max_examples=100, deadline=timedelta(seconds=2))
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def agentruns_migrations() -> Sequence[MigrationChain]:
    """The contract kinds include the review example's kind: its table is in every database."""
    return CHAINS


@pytest.fixture(scope="session")
def postgres_server(agentruns_server: PostgresTestServer) -> str:
    """The session's server URL (its ``postgres`` database)."""
    return agentruns_server.url


@pytest.fixture
def postgres_url(agentruns_database_url: str) -> str:
    """A migrated database of this test's own, dropped after it."""
    return agentruns_database_url
