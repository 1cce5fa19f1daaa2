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

from agentruns.adapters.postgres.connections import (
    ConnectionOptions,
    libpq_url,
    postgres_url,
    url_pooler,
)
from agentruns.adapters.postgres.migrate import alembic_config, migrate
from agentruns.domain.errors import DatabaseTimeout, StoreUnavailable

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _checked(url: str) -> str:
    """``url`` if it is a PostgreSQL URL, or a one-line error naming what is wrong with it."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise StoreUnavailable(f"the database URL {_masked(url)!r} cannot be parsed") from None
    try:
        postgres_url(url)
    except ValueError:
        shown = parsed.render_as_string(hide_password=True)
        raise StoreUnavailable(f"the database URL {shown} is not a postgresql:// URL") from None
    try:
        url_pooler(url)
    except ValueError as exc:
        raise StoreUnavailable(str(exc)) from None
    return url


def _parsed(url: str) -> str:
    """The libpq URL of ``url`` (without agentruns' own parameters), or a one-line error."""
    return libpq_url(_checked(url))


def _named(options: ConnectionOptions | None) -> str:
    return (options or ConnectionOptions()).application_name


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
    """The URL of database ``name`` on the server of ``url`` (with the same parameters, an
    ``agentruns_pooler=`` too)."""
    if not _NAME.match(name):
        raise StoreUnavailable(f"not a plain database name: {name!r}")
    parsed = make_url(_checked(url))
    return parsed.set(database=name).render_as_string(hide_password=False)


def _shown(url: str) -> str:
    parsed = make_url(url)
    host = parsed.host or parsed.query.get("host") or "localhost"
    return f"{host}:{parsed.port or 5432}/{parsed.database or ''}"


# What the server answers when it was reached and refused the connection: the role's
# credentials (28P01, 28000: a wrong password, no pg_hba.conf entry), the database or role that
# does not exist (3D000, 28000), CONNECT not granted (42501). libpq gives a connection error no
# SQLSTATE, so the server's words are read too (they are English unless lc_messages says not).
_REFUSALS = ("28P01", "28000", "3D000", "42501")
_REFUSED_WORDS = (
    "password authentication failed",
    "authentication failed",
    "no password supplied",
    "pg_hba.conf",
    "does not exist",
    "permission denied for database",
)


def _unavailable(url: str, exc: psycopg.Error) -> StoreUnavailable:
    """A failed connection as one line: a server that was reached and refused the role (a bad
    password is not "cannot reach"), else one that could not be reached."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    if exc.sqlstate in _REFUSALS or any(words in detail for words in _REFUSED_WORDS):
        return StoreUnavailable(f"PostgreSQL at {_shown(url)} refused the connection: {detail}")
    return StoreUnavailable(f"cannot reach PostgreSQL at {_shown(url)}: {detail}")


def connect(
    url: str, options: ConnectionOptions | None = None
) -> psycopg.Connection[tuple[object, ...]]:
    """A plain autocommit connection, or StoreUnavailable saying why there is none. It
    prepares nothing (psycopg's default waits for a statement's fifth run, which none here
    reaches), so it works through a transaction pooler as it is."""
    libpq = _parsed(url)
    try:
        return psycopg.connect(
            libpq, autocommit=True, connect_timeout=5, application_name=_named(options)
        )
    except psycopg.Error as exc:
        raise _unavailable(url, exc) from exc


def ping(url: str, timeout: int = 3, options: ConnectionOptions | None = None) -> None:
    """Return if the database answers ``SELECT 1`` within ``timeout`` seconds, else raise
    StoreUnavailable saying why (the health check of a worker or reaper)."""
    libpq = _parsed(url)
    try:
        with psycopg.connect(
            libpq, autocommit=True, connect_timeout=timeout, application_name=_named(options)
        ) as connection:
            connection.execute("SELECT 1", prepare=False)
    except psycopg.Error as exc:
        raise _unavailable(url, exc) from exc


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise StoreUnavailable("the agentruns migrations have no revision")
    return head


def schema_revision(url: str, options: ConnectionOptions | None = None) -> tuple[str | None, str]:
    """The database's schema revision (``None``: never migrated) and the newest one."""
    with connect(url, options) as connection:
        try:
            found = connection.execute("SELECT to_regclass('alembic_version')").fetchone()
            rows = []
            if found is not None and found[0] is not None:
                rows = connection.execute("SELECT version_num FROM alembic_version").fetchall()
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot read the schema revision: {exc}") from exc
    return (str(rows[0][0]) if rows else None), head_revision()


def upgrade(
    url: str, *, lock_timeout: float | None = None, options: ConnectionOptions | None = None
) -> str:
    """Migrate to the newest revision; that revision.

    With ``lock_timeout`` (seconds), a lock the migration would wait longer for fails it with
    :class:`DatabaseTimeout`, and the database stays at the revision it had (the upgrade is
    one transaction): the caller may try again later."""
    connect(url, options).close()  # a clear error first, rather than one from inside a migration
    try:
        migrate(url, lock_timeout=lock_timeout, options=options)
    except Exception as exc:
        if lock_timeout is not None and _waited_for_a_lock(exc):
            current, _ = schema_revision(url, options)
            raise DatabaseTimeout(
                f"the migration waited more than {lock_timeout:g} s for a lock another "
                f"transaction holds, and gave up; the schema stays at revision "
                f"{current or 'none'} (pg_locks and pg_stat_activity show the holder)",
                lock_timeout,
            ) from exc
        detail = " ".join(str(exc).split())
        raise StoreUnavailable(f"the migration failed: {detail}") from exc
    return head_revision()


def _waited_for_a_lock(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it wraps or was raised from, is PostgreSQL's lock_timeout."""
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending:
        found = pending.pop()
        if id(found) in seen:
            continue
        seen.add(id(found))
        if isinstance(found, psycopg.errors.LockNotAvailable):
            return True
        for inner in (getattr(found, "orig", None), found.__cause__, found.__context__):
            if isinstance(inner, BaseException):
                pending.append(inner)
    return False


def recreate_database(url: str, name: str, options: ConnectionOptions | None = None) -> str:
    """Drop database ``name`` (if it exists) and create it empty; its URL."""
    if not _NAME.match(name):
        raise ValueError(f"not a plain database name: {name!r}")
    with connect(url, options) as connection:
        try:
            connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            connection.execute(f"CREATE DATABASE {name}")
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot create the database {name}: {exc}") from exc
    return make_url(url).set(database=name).render_as_string(hide_password=False)
