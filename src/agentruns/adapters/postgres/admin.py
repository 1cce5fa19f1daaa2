"""Operating a database: is it there, which schema revision it has, a fresh database for a demo.

Every failure leaves as a one-line :class:`~agentruns.domain.errors.StoreUnavailable` that says
what to fix (a wrong URL, a server that does not answer, a schema that is not migrated), so the
command line can print it without a traceback.
"""

from __future__ import annotations

import re

import psycopg
from alembic.script import ScriptDirectory
from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError

from agentruns.adapters.postgres.database import libpq_url, postgres_url
from agentruns.adapters.postgres.migrate import alembic_config, migrate
from agentruns.domain.errors import StoreUnavailable

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _parsed(url: str) -> str:
    """The libpq URL of ``url``, or a one-line error naming what is wrong with it."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise StoreUnavailable(f"the database URL {_masked(url)!r} cannot be parsed") from None
    try:
        postgres_url(url)
    except ValueError:
        shown = parsed.render_as_string(hide_password=True)
        raise StoreUnavailable(f"the database URL {shown} is not a postgresql:// URL") from None
    return libpq_url(url)


def _masked(url: str) -> str:
    """A URL that did not parse, with anything between ``:`` and ``@`` hidden (a password)."""
    return re.sub(r"(://[^/:@]*):[^@/]*@", r"\1:***@", url)


def shown_url(url: str) -> str:
    """The URL with its password hidden, for a command to print (StoreUnavailable if it is not
    a PostgreSQL URL)."""
    parsed = make_url(_parsed(url))
    # An empty password (the embedded server's) is shown as it is: there is nothing to hide.
    return parsed.render_as_string(hide_password=bool(parsed.password))


def with_database(url: str, name: str) -> str:
    """The URL of database ``name`` on the server of ``url``."""
    if not _NAME.match(name):
        raise StoreUnavailable(f"not a plain database name: {name!r}")
    parsed = make_url(_parsed(url))
    return parsed.set(database=name).render_as_string(hide_password=False)


def _shown(url: str) -> str:
    parsed = make_url(url)
    host = parsed.host or parsed.query.get("host") or "localhost"
    return f"{host}:{parsed.port or 5432}/{parsed.database or ''}"


def connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A plain autocommit connection, or StoreUnavailable saying why there is none."""
    libpq = _parsed(url)
    try:
        return psycopg.connect(libpq, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise StoreUnavailable(f"cannot reach PostgreSQL at {_shown(url)}: {detail}") from exc


def ping(url: str, timeout: int = 3) -> None:
    """Return if the database answers ``SELECT 1`` within ``timeout`` seconds, else raise
    StoreUnavailable saying why (the health check of a worker or reaper)."""
    libpq = _parsed(url)
    try:
        with psycopg.connect(libpq, autocommit=True, connect_timeout=timeout) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise StoreUnavailable(f"cannot reach PostgreSQL at {_shown(url)}: {detail}") from exc


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise StoreUnavailable("the agentruns migrations have no revision")
    return head


def schema_revision(url: str) -> tuple[str | None, str]:
    """The database's schema revision (``None``: never migrated) and the newest one."""
    with connect(url) as connection:
        try:
            found = connection.execute("SELECT to_regclass('alembic_version')").fetchone()
            rows = []
            if found is not None and found[0] is not None:
                rows = connection.execute("SELECT version_num FROM alembic_version").fetchall()
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot read the schema revision: {exc}") from exc
    return (str(rows[0][0]) if rows else None), head_revision()


def upgrade(url: str) -> str:
    """Migrate to the newest revision; that revision."""
    connect(url).close()  # a clear error first, rather than one from inside a migration
    try:
        migrate(url)
    except Exception as exc:
        detail = " ".join(str(exc).split())
        raise StoreUnavailable(f"the migration failed: {detail}") from exc
    return head_revision()


def recreate_database(url: str, name: str) -> str:
    """Drop database ``name`` (if it exists) and create it empty; its URL."""
    if not _NAME.match(name):
        raise ValueError(f"not a plain database name: {name!r}")
    with connect(url) as connection:
        try:
            connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            connection.execute(f"CREATE DATABASE {name}")
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot create the database {name}: {exc}") from exc
    return make_url(url).set(database=name).render_as_string(hide_password=False)
