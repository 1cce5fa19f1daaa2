"""The PostgreSQL transaction scope, and the one place driver errors become agentruns errors.

Every store runs its statements through :func:`fetch` / :func:`execute` on the connection of the
:class:`PostgresTransaction` it is handed; a driver error leaves the adapter only translated
(``raise ... from exc``): a trigger or constraint refusal becomes
:class:`~agentruns.domain.errors.IllegalTransition`, a value PostgreSQL cannot take (a driver
``DataError``: a number out of range, text it cannot encode) becomes
:class:`~agentruns.domain.errors.InvalidRequest`, anything else
:class:`~agentruns.domain.errors.StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy import URL, TextClause, event, make_url
from sqlalchemy.dialects.postgresql.psycopg import PGDialectAsync_psycopg
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from agentruns.app.ports import Clock, Transaction, TransactionScope
from agentruns.domain.errors import (
    AgentRunsError,
    IllegalTransition,
    InvalidRequest,
    StoreUnavailable,
    TransactionConflict,
)

# What the refusals of agentruns' own constraints and triggers mean (ddl/guards.sql, events.sql
# and sandboxes.sql; ADRs/0016). Every other integrity error (a host's constraint or trigger on
# its domain row, say) is a refusal too, named by its constraint: it becomes IllegalTransition
# just the same, never StoreUnavailable.
_REFUSALS = {
    "guard_agent_run": "the run's state table or identity",
    "guard_agent_run_epoch": "a claim takes the next epoch and nothing else changes it",
    "guard_agent_run_holder": "the holder changes only with a claim",
    "guard_agent_run_attempt": "an attempt is spent only by a lease going back to the queue",
    "guard_agent_run_frozen": "a run keeps what it was enqueued with",
    "guard_agent_run_delete": "only an ended run is deleted",
    "guard_agent_run_event": "events are appended under the run's current lease, never rewritten",
    "guard_agent_run_reason": "an unknown end reason",
    "guard_agent_run_lease": "a lease is longer than zero",
    "guard_agent_run_queued": "a queued run has no holder, lease or end",
    "guard_agent_run_leased": "a leased run has a holder and a lease",
    "guard_agent_run_ended": "an ended run has a reason and an end time, and no lease",
    "uq_agent_run_head": "a subject has one head run (its leased run, or its first queued one)",
    "ck_agent_run_head": "a leased run is its subject's head, an ended run is not",
    "agent_run_pkey": "a run with this id exists already",
    "guard_agent_sandbox": "the sandbox's state table or identity",
    "guard_agent_sandbox_times": "a sandbox's first call is kept and its last use never goes back",
    "uq_agent_sandbox_live_subject": "at most one live sandbox per subject",
    "uq_agent_sandbox_claim_name": "a sandbox with this claim exists already",
    "agent_sandbox_pkey": "a sandbox with this id exists already",
}


# Schemes that name PostgreSQL: libpq's two, and SQLAlchemy's with any driver after a "+".
_BACKENDS = ("postgresql", "postgres")


def postgres_url(url: str) -> URL:
    """``url`` parsed, if it names PostgreSQL: ``postgresql://``, ``postgres://`` (as libpq and
    most hosting providers write it) or ``postgresql+driver://``. ValueError otherwise."""
    parsed = make_url(url)
    if parsed.drivername.split("+", 1)[0] not in _BACKENDS:
        raise ValueError(f"not a PostgreSQL URL: {parsed.render_as_string(hide_password=True)}")
    return parsed


def sqlalchemy_url(url: str) -> str:
    """A PostgreSQL URL as the async psycopg 3 driver URL SQLAlchemy wants."""
    parsed = postgres_url(url)
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The plain ``postgresql://`` URL a bare psycopg connection takes."""
    parsed = postgres_url(url)
    rendered = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    # SQLAlchemy writes a space of the query as "+", which libpq reads as a plus: startup
    # options ("-csearch_path=a -cstatement_timeout=5s") reach libpq only as %20.
    base, mark, query = rendered.partition("?")
    return base + mark + query.replace("+", "%20")


def translate(exc: BaseException) -> AgentRunsError:
    """The agentruns error a driver error means (the caller raises it ``from exc``)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if isinstance(orig, psycopg.errors.IntegrityError):
        name = orig.diag.constraint_name or ""
        why = _REFUSALS.get(name, f"constraint {name}" if name else "an integrity check")
        return IllegalTransition("the database", "refused", f"{why}: {orig.diag.message_primary}")
    if isinstance(orig, (psycopg.DataError, ValueError)):
        # PostgreSQL, or the driver before it sends (text it cannot encode, a number it cannot
        # write), cannot take a value: the request's fault, not an outage, so not retried.
        return InvalidRequest(f"PostgreSQL cannot store a value of this request: {orig}")
    if isinstance(orig, psycopg.errors.InsufficientPrivilege):
        return StoreUnavailable(
            f"PostgreSQL refused the connecting role: {orig.diag.message_primary} "
            "(`agentruns db grants --role worker|reader` prints what each role needs)"
        )
    if isinstance(orig, (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)):
        return TransactionConflict(f"PostgreSQL aborted a conflicting transaction: {orig}")
    return StoreUnavailable(f"PostgreSQL failed: {orig}")


class PostgresTransaction(Transaction):
    """An open transaction: the connection of the PostgreSQL stores that share it.

    ``connection`` is SQLAlchemy's (what a kind's handler runs its domain row's statements on);
    an autocommitted statement scope has only the psycopg connection (``driver``), as no
    handler runs there."""

    def __init__(
        self,
        connection: AsyncConnection | None,
        driver: psycopg.AsyncConnection[Any] | None = None,
    ) -> None:
        self._connection = connection
        self._driver = driver

    @property
    def connection(self) -> AsyncConnection:
        if self._connection is None:
            raise TypeError("an autocommitted statement of agentruns has no SQLAlchemy connection")
        return self._connection

    async def driver(self) -> psycopg.AsyncConnection[Any]:
        """The psycopg connection under ``connection``: the adapter's own statements run on it
        directly (:func:`fetch`), in the same transaction."""
        if self._driver is None:
            raw = await self.connection.get_raw_connection()
            driver = raw.driver_connection
            if not isinstance(driver, psycopg.AsyncConnection):
                raise TypeError("the PostgreSQL adapter runs on psycopg 3 only")
            self._driver = driver
        return self._driver


def postgres_connection(tx: Transaction) -> AsyncConnection:
    """The SQLAlchemy connection of an agentruns transaction on PostgreSQL.

    A kind's handler runs the statements of its own domain row on it, inside agentruns'
    transaction, so the row and its run commit or roll back together. Driver errors raised
    there leave the transaction translated like agentruns' own: a refused constraint or trigger
    as :class:`~agentruns.domain.errors.IllegalTransition`."""
    if not isinstance(tx, PostgresTransaction):
        raise TypeError("a PostgreSQL store was handed a transaction of another adapter family")
    return tx.connection


Row = Mapping[str, Any]

# The adapter's statements are declared as SQLAlchemy text (sql.statement: named binds, typed
# where the driver cannot infer the type) and run on the psycopg connection itself: compiled
# once to psycopg's parameter style, their typed binds converted as SQLAlchemy would. Going
# through SQLAlchemy's execution and result layers cost about 0.3 ms of client CPU per
# statement, more than many of the statements themselves (ADRs/0019).
_DIALECT = PGDialectAsync_psycopg()  # type: ignore[no-untyped-call]
_Processors = tuple[tuple[str, Any], ...]
_COMPILED: dict[TextClause, tuple[str, _Processors]] = {}


def compiled(statement: TextClause) -> tuple[str, _Processors]:
    """``statement`` as psycopg runs it: its SQL in psycopg's parameter style, and the
    conversions of its typed binds (by name), made once."""
    found = _COMPILED.get(statement)
    if found is None:
        compiled = statement.compile(dialect=_DIALECT)
        processors = tuple(
            (name, processor)
            for name, bind in compiled.binds.items()
            if (processor := bind.type.dialect_impl(_DIALECT).bind_processor(_DIALECT))
        )
        found = _COMPILED[statement] = (compiled.string, processors)
    return found


def bound(statement: TextClause, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``statement`` and ``params`` exactly as the adapter sends them to psycopg."""
    query, processors = compiled(statement)
    values = dict(params)
    for name, processor in processors:
        if name in values:
            values[name] = processor(values[name])
    return query, values


async def _run(
    tx: Transaction, statement: TextClause, params: Mapping[str, Any]
) -> psycopg.AsyncCursor[dict[str, Any]]:
    if not isinstance(tx, PostgresTransaction):
        raise TypeError("a PostgreSQL store was handed a transaction of another adapter family")
    query, values = bound(statement, params)
    cursor = (await tx.driver()).cursor(row_factory=dict_row)
    await cursor.execute(query, values, prepare=True)
    return cursor


async def fetch(tx: Transaction, statement: TextClause, params: Mapping[str, Any]) -> list[Row]:
    """Run ``statement`` in ``tx`` and return its rows, translating driver errors."""
    try:
        cursor = await _run(tx, statement, params)
        # Not ``cursor.description``: it builds a column object per column on every read.
        result = cursor.pgresult
        if result is None or result.status != psycopg.pq.ExecStatus.TUPLES_OK:
            return []
        return list(await cursor.fetchall())
    except (psycopg.Error, OSError, ValueError) as exc:
        raise translate(exc) from exc


async def execute(tx: Transaction, statement: TextClause, params: Mapping[str, Any]) -> int:
    """Run ``statement`` in ``tx`` for its effect; the number of rows it touched."""
    try:
        return (await _run(tx, statement, params)).rowcount
    except (psycopg.Error, OSError, ValueError) as exc:
        raise translate(exc) from exc


async def _configure(connection: psycopg.AsyncConnection[Any]) -> None:
    """A statement connection's settings: as :func:`_plan_once`, on a bare psycopg connection."""
    await connection.execute("SET plan_cache_mode = force_generic_plan")


def _plan_once(dbapi_connection: Any, _record: object) -> None:
    """Run prepared statements on their generic plan from the first execution: the adapter's
    statements are shaped for it (one SQL text for the pinned and the database clock, partial
    indexes chosen whatever the parameters), and PostgreSQL's default plans five custom plans
    per statement and connection before it tries the generic one (ADRs/0011)."""
    cursor = dbapi_connection.cursor()
    cursor.execute("SET plan_cache_mode = force_generic_plan")
    cursor.close()
    dbapi_connection.commit()


class PostgresDatabase(TransactionScope):
    """An async engine (psycopg 3) and its pool; the transaction scope of the PostgreSQL stores.

    ``clock=None`` decides every time on the database clock; a pinned :class:`Clock` (tests) is
    handed to each statement as its ``now`` instead, with the same SQL text.
    """

    def __init__(
        self,
        url: str,
        clock: Clock | None = None,
        *,
        pool_size: int = 5,
        max_overflow: int = 10,
        engine: AsyncEngine | None = None,
    ) -> None:
        self.url = url
        self.clock = clock
        # READ COMMITTED whatever the server's default: the head bookkeeping relies on each
        # statement of its triggers seeing every commit before it (ADRs/0004, ADRs/0017).
        self.engine = engine or create_async_engine(
            sqlalchemy_url(url),
            pool_size=pool_size,
            max_overflow=max_overflow,
            isolation_level="READ COMMITTED",
            # Prepare every statement on its first run on a connection (psycopg's default waits
            # for the fifth): the claim costs more to plan than to run (ADRs/0011).
            connect_args={"prepare_threshold": 0},
        )
        event.listen(self.engine.sync_engine, "connect", _plan_once)
        # Autocommitted statements (a claim of plain kinds, a group of ends) check out bare
        # psycopg connections from a small pool of their own, one per event loop: SQLAlchemy's
        # checkout, isolation switch and reset cost more client time than the statement.
        self._statement_pool_size = max(2, min(pool_size, 8))
        self._statement_pools: dict[asyncio.AbstractEventLoop, AsyncConnectionPool] = {}

    def now_param(self) -> datetime | None:
        """The ``now`` bound into statements: the pinned clock's, or None for ``now()``."""
        return None if self.clock is None else self.clock.now()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PostgresTransaction]:
        try:
            async with self.engine.begin() as connection:
                yield PostgresTransaction(connection)
        except (SQLAlchemyError, psycopg.Error, OSError) as exc:
            raise translate(exc) from exc

    @asynccontextmanager
    async def statement(self) -> AsyncIterator[PostgresTransaction]:
        # Autocommit: psycopg sends no BEGIN and no COMMIT, so a claim or a group end costs one
        # round trip, as the raw queue's statements do (ADRs/0017).
        try:
            pool = await self._statement_pool()
            async with pool.connection() as connection:
                yield PostgresTransaction(None, connection)
        except (psycopg.Error, PoolTimeout, OSError) as exc:
            raise translate(exc) from exc

    async def _statement_pool(self) -> AsyncConnectionPool:
        loop = asyncio.get_running_loop()
        pool = self._statement_pools.get(loop)
        if pool is None:
            for stale in [other for other in self._statement_pools if other.is_closed()]:
                del self._statement_pools[stale]  # its loop is gone, and its connections
            pool = self._statement_pools[loop] = AsyncConnectionPool(
                libpq_url(self.url),
                min_size=1,
                max_size=self._statement_pool_size,
                kwargs={"autocommit": True, "prepare_threshold": 0},
                configure=_configure,
                open=False,
            )
        if pool.closed:
            await pool.open()  # idempotent, if another task opened it meanwhile
        return pool

    @asynccontextmanager
    async def savepoint(self, tx: Transaction) -> AsyncIterator[None]:
        try:
            async with postgres_connection(tx).begin_nested():
                yield
        except (SQLAlchemyError, psycopg.Error, OSError) as exc:
            raise translate(exc) from exc

    async def dispose(self) -> None:
        pool = self._statement_pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()
        await self.engine.dispose()
