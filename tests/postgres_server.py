"""The PostgreSQL the test suite and the benchmarks use, over ``agentruns.testing.postgres``: an
embedded private server, or the one ``AGENTRUNS_TEST_DATABASE_URL`` names.

The template here holds agentruns' schema and the review example's chain (the contract kinds
include the review kind); each test gets its own database cloned from it, dropped after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from agentruns.testing.postgres import (
    cloned_database as _cloned,
    create_template as _create,
    empty_database,
    server_url,
)
from examples.review import MIGRATIONS as REVIEW_MIGRATIONS

TEMPLATE = "agentruns_template"
CHAINS = (REVIEW_MIGRATIONS,)

__all__ = [
    "CHAINS",
    "TEMPLATE",
    "cloned_database",
    "create_template",
    "empty_database",
    "server_url",
]


def create_template(url: str) -> None:
    """The migrated template database (made afresh: the schema may have changed)."""
    _create(url, TEMPLATE, CHAINS)


@contextlib.contextmanager
def cloned_database(url: str, template: str = TEMPLATE) -> Iterator[str]:
    """A fresh database cloned from ``template``, dropped when the block ends."""
    with _cloned(url, template) as database:
        yield database
