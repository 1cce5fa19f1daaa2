"""Run the Alembic revisions that ship with agentruns, from a checkout or an installed wheel; and
a host's own chain of revisions (its domain rows' tables) beside them.

agentruns' revisions form one linear chain recorded in ``alembic_version``. A host's tables are
not part of it: a :class:`MigrationChain` is a folder of the host's revisions with a version
table of its own, run through the same environment after agentruns' schema (ADRs/0013), so
agentruns' upgrade and revision checks never meet a revision they do not know.

An upgrade is one transaction (every revision of it commits together or not at all). With a
``lock_timeout`` it gives up on a lock it would wait longer for, rather than queue every
other client of the table behind its own wait (PostgreSQL grants locks in order: a migration
waiting for an ACCESS EXCLUSIVE lock stops even the readers that come after it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, create_engine, text

from agentruns.adapters.postgres.connections import ConnectionOptions, sqlalchemy_url
from agentruns.adapters.postgres.search_path import in_schema, schema_of

_PACKAGE = Path(__file__).resolve().parents[2]  # .../agentruns
CORE_VERSION_TABLE = "alembic_version"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True, slots=True)
class MigrationChain:
    """A host's own chain of Alembic revisions: the folder of its revision files, and the table
    that records how far a database has come (never ``alembic_version``, which is agentruns').

    Its first revision has ``down_revision = None`` and may reference agentruns' tables, since
    a chain runs after agentruns' schema is migrated.
    """

    versions: Path
    version_table: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "versions", Path(self.versions).resolve())
        if not _IDENTIFIER.match(self.version_table):
            raise ValueError(f"not a plain table name: {self.version_table!r}")
        if self.version_table == CORE_VERSION_TABLE:
            raise ValueError(f"{CORE_VERSION_TABLE} records agentruns' own revisions")
        if not self.versions.is_dir():
            raise ValueError(f"no folder of revisions at {self.versions}")


def migrations_path() -> Path:
    """``agentruns/_migrations`` in a wheel; the top-level ``migrations/`` in a checkout."""
    for candidate in (_PACKAGE / "_migrations", _PACKAGE.parents[1] / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("the agentruns migrations are missing from this installation")


def alembic_config(chain: MigrationChain | None = None) -> Config:
    """agentruns' environment over its own revisions, or over ``chain``'s."""
    config = Config()
    config.set_main_option("script_location", str(migrations_path()))
    if chain is not None:
        config.set_main_option("path_separator", "os")
        config.set_main_option("version_locations", str(chain.versions))
        config.attributes["version_table"] = chain.version_table
    return config


def migrate(
    url: str,
    revision: str = "head",
    *,
    chain: MigrationChain | None = None,
    lock_timeout: float | None = None,
    options: ConnectionOptions | None = None,
    schema: str | None = None,
) -> None:
    """Upgrade the database at ``url`` to ``revision`` (the newest by default): agentruns'
    schema, or with ``chain`` the host's chain (after agentruns' schema is migrated).

    ``lock_timeout`` (seconds): a lock the upgrade would wait longer for makes it fail (with a
    ``LockNotAvailable`` from the driver) and roll back whole. ``options``: the connection's
    name and pooler. ``schema`` (or the search_path the URL's startup options set:
    ``AGENTRUNS_SCHEMA``) is where everything is created, Alembic's version table included; it
    is created first if missing."""
    _run(
        in_schema(url, schema),
        chain,
        lambda config: command.upgrade(config, revision),
        lock_timeout,
        options,
    )


def downgrade(
    url: str,
    revision: str,
    *,
    chain: MigrationChain | None = None,
    schema: str | None = None,
) -> None:
    """Downgrade the database at ``url`` to ``revision`` (``"base"``: an empty schema); the
    schema itself stays."""
    _run(in_schema(url, schema), chain, lambda config: command.downgrade(config, revision))


def _run(
    url: str,
    chain: MigrationChain | None,
    action: Callable[[Config], None],
    lock_timeout: float | None = None,
    options: ConnectionOptions | None = None,
) -> None:
    schema = schema_of(url)
    chosen = (options or ConnectionOptions()).on(url)
    connect_args: dict[str, object] = {"application_name": chosen.application_name}
    if not chosen.prepares:
        # Through a transaction pooler, nothing is prepared: the server connection goes to
        # another client after the migration's transaction, its prepared statements with it.
        connect_args["prepare_threshold"] = None
    engine = create_engine(sqlalchemy_url(url), connect_args=connect_args)  # psycopg 3: sync too
    try:
        with engine.begin() as connection:
            if schema is not None:
                _create_schema(connection, schema)
            if lock_timeout is not None:
                # SET LOCAL: for this transaction only, so it cannot leak through a pooler.
                milliseconds = max(1, round(lock_timeout * 1000))
                connection.exec_driver_sql(f"SET LOCAL lock_timeout = {milliseconds}")
            config = alembic_config(chain)
            config.attributes["connection"] = connection
            config.attributes["version_table_schema"] = schema
            action(config)
    finally:
        engine.dispose()


def _create_schema(connection: Connection, schema: str) -> None:
    """Create ``schema`` unless it exists. Looked up first: ``CREATE SCHEMA IF NOT EXISTS``
    checks the CREATE privilege on the database even when the schema is there, and an owner
    whose schema an administrator made has no need of it."""
    found = connection.execute(
        text("SELECT 1 FROM pg_namespace WHERE nspname = :schema"), {"schema": schema}
    ).first()
    if found is None:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))  # a plain name (schema_of)
