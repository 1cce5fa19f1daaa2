"""The PostgreSQL adapters: SQLAlchemy Core on psycopg 3, async.

``PostgresFamily(url, clock)`` builds the family the container and the contract suite use;
``migrate(url)`` brings a database to the newest schema (the revisions ship in the wheel).
"""

from __future__ import annotations

from agentruns.adapters.postgres.connections import ConnectionOptions
from agentruns.adapters.postgres.database import PostgresDatabase, PostgresTransaction
from agentruns.adapters.postgres.holders import PostgresHolderStore
from agentruns.adapters.postgres.limits import PostgresLimitStore
from agentruns.adapters.postgres.migrate import migrate, migrations_path
from agentruns.adapters.postgres.notifier import PostgresNotifier
from agentruns.adapters.postgres.runs import PostgresEventLog, PostgresRunStore
from agentruns.adapters.postgres.sandboxes import PostgresSandboxStore
from agentruns.adapters.postgres.schedules import PostgresScheduleStore
from agentruns.adapters.postgres.stats import PostgresRunStats
from agentruns.adapters.postgres.workspaces import PostgresWorkspaceStore
from agentruns.app.family import AdapterFamily
from agentruns.app.ports import Clock, Stores


class PostgresFamily(AdapterFamily):
    """The PostgreSQL stores over one engine; the sandbox and schedule stores and the read model
    beside them.

    Opens no connection until first used; :meth:`close` disposes of the pool and the listening
    connection. Every time decision is on the database clock unless ``clock`` pins one (tests).
    ``options`` name the connections and bound them, and say whether a transaction pooler sits
    in front of the server (the URL's ``agentruns_pooler=`` says so too).
    """

    def __init__(
        self,
        url: str | None,
        clock: Clock | None = None,
        *,
        pool_size: int = 5,
        options: ConnectionOptions | None = None,
    ) -> None:
        if not url:
            raise ValueError("the postgres profile needs a database URL (AGENTRUNS_DATABASE_URL)")
        self.database = PostgresDatabase(url, clock, pool_size=pool_size, options=options)
        self.runs = PostgresRunStore(self.database)
        self.events = PostgresEventLog(self.database, self.runs)
        self.workspaces = PostgresWorkspaceStore(self.database)
        self.notifier = PostgresNotifier(url, self.database.options)
        self.limits = PostgresLimitStore(self.database)
        self._stores = Stores(
            scope=self.database,
            runs=self.runs,
            events=self.events,
            workspaces=self.workspaces,
            notifier=self.notifier,
            limits=self.limits,
        )
        self._sandboxes = PostgresSandboxStore(self.database)
        self._stats = PostgresRunStats(self.database)
        self._schedules = PostgresScheduleStore(self.database)
        self._holders = PostgresHolderStore(self.database)

    @property
    def stores(self) -> Stores:
        return self._stores

    @property
    def sandboxes(self) -> PostgresSandboxStore:
        return self._sandboxes

    @property
    def stats(self) -> PostgresRunStats:
        return self._stats

    @property
    def schedules(self) -> PostgresScheduleStore:
        return self._schedules

    @property
    def holders(self) -> PostgresHolderStore:
        return self._holders

    async def close(self) -> None:
        await self.notifier.close()
        await self.database.dispose()


def make_postgres_stores(
    url: str | None,
    clock: Clock | None = None,
    *,
    pool_size: int = 5,
    options: ConnectionOptions | None = None,
) -> Stores:
    """The stores of a fresh :class:`PostgresFamily`; ``close_postgres_stores`` releases them."""
    return PostgresFamily(url, clock, pool_size=pool_size, options=options).stores


async def close_postgres_stores(stores: Stores) -> None:
    if isinstance(stores.notifier, PostgresNotifier):
        await stores.notifier.close()
    if isinstance(stores.scope, PostgresDatabase):
        await stores.scope.dispose()


__all__ = [
    "ConnectionOptions",
    "PostgresDatabase",
    "PostgresEventLog",
    "PostgresFamily",
    "PostgresHolderStore",
    "PostgresLimitStore",
    "PostgresNotifier",
    "PostgresRunStore",
    "PostgresSandboxStore",
    "PostgresScheduleStore",
    "PostgresTransaction",
    "PostgresWorkspaceStore",
    "close_postgres_stores",
    "make_postgres_stores",
    "migrate",
    "migrations_path",
]
