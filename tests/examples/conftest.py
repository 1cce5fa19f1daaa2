"""The examples' own tables are in every test database here, after agentruns' schema: a host's
``conftest.py`` overrides ``agentruns_migrations`` the same way."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agentruns import MigrationChain
from examples.review import MIGRATIONS as REVIEW
from examples.tickets import MIGRATIONS as TICKETS


@pytest.fixture(scope="session")
def agentruns_migrations() -> Sequence[MigrationChain]:
    return (REVIEW, TICKETS)
