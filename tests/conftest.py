"""Test-wide settings: hypothesis profiles (``HYPOTHESIS_PROFILE=ci`` in CI), and PostgreSQL.

``postgres_url`` is a database of its own for one test, cloned from a migrated template on the
session's server (embedded unless ``AGENTRUNS_TEST_DATABASE_URL`` names one); the server starts
only when a test asks for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings

from tests.postgres_server import cloned_database, create_template, server_url

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
def postgres_server() -> Iterator[str]:
    """The session's server URL, with the migrated template database made."""
    with server_url() as url:
        create_template(url)
        yield url


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A migrated database of this test's own, dropped after it."""
    with cloned_database(postgres_server) as url:
        yield url
