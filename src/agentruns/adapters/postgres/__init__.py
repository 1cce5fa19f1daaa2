"""The PostgreSQL adapters: SQLAlchemy Core on psycopg 3, async.

``make_postgres_stores(url, clock)`` builds the family the container and the contract suite use;
``migrate(url)`` brings a database to the newest schema (the revisions ship in the wheel).
"""

from __future__ import annotations

from agentruns.adapters.postgres.database import PostgresDatabase, PostgresTransaction
from agentruns.adapters.postgres.migrate import migrate, migrations_path
from agentruns.adapters.postgres.notifier import PostgresNotifier
from agentruns.adapters.postgres.reviews import PostgresReviewJobs
from agentruns.adapters.postgres.runs import PostgresEventLog, PostgresRunStore
from agentruns.adapters.postgres.sandboxes import PostgresSandboxStore
from agentruns.adapters.postgres.workspaces import PostgresWorkspaceStore
from agentruns.app.ports import Clock, Stores


def make_postgres_stores(
    url: str | None, clock: Clock | None = None, *, pool_size: int = 5
) -> Stores:
    """The PostgreSQL stores over one engine. Opens no connection until first used;
    ``close_postgres_stores`` disposes of the pool and the listening connection."""
    if not url:
        raise ValueError("the postgres profile needs a database URL (AGENTRUNS_DATABASE_URL)")
    database = PostgresDatabase(url, clock, pool_size=pool_size)
    runs = PostgresRunStore(database)
    return Stores(
        scope=database,
        runs=runs,
        events=PostgresEventLog(database, runs),
        workspaces=PostgresWorkspaceStore(database),
        notifier=PostgresNotifier(url),
    )


async def close_postgres_stores(stores: Stores) -> None:
    if isinstance(stores.notifier, PostgresNotifier):
        await stores.notifier.close()
    if isinstance(stores.scope, PostgresDatabase):
        await stores.scope.dispose()


__all__ = [
    "PostgresDatabase",
    "PostgresEventLog",
    "PostgresNotifier",
    "PostgresReviewJobs",
    "PostgresRunStore",
    "PostgresSandboxStore",
    "PostgresTransaction",
    "PostgresWorkspaceStore",
    "close_postgres_stores",
    "make_postgres_stores",
    "migrate",
    "migrations_path",
]
