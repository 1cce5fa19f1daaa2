"""Alembic environment: runs the revisions on the connection handed in, or on the configured URL.

``agentruns.adapters.postgres.migrate`` hands a connection in through ``config.attributes``; the
``alembic`` command line uses ``sqlalchemy.url`` from its configuration instead. A host's chain
of revisions runs here too, recorded in the version table it names (``version_table``), in the
schema of ``version_table_schema`` when one is set.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

config = context.config


def _run(connection: Connection) -> None:
    version_table = config.attributes.get("version_table", "alembic_version")
    # The schema of AGENTRUNS_SCHEMA, which the connection's search_path names too (None: the
    # search_path's first schema, public by default).
    version_table_schema = config.attributes.get("version_table_schema")
    context.configure(
        connection=connection,
        transactional_ddl=True,
        version_table=version_table,
        version_table_schema=version_table_schema,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url or hand a connection to the migration")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("agentruns migrations run online only")
run_migrations_online()
