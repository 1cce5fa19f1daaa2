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
from sqlalchemy import TextClause, event
from sqlalchemy.dialects.postgresql.psycopg import PGDialectAsync_psycopg
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from agentruns.adapters.postgres.connections import (
    ConnectionOptions,
    libpq_url,
    sqlalchemy_url,
)
from agentruns.app.ports import Clock, Transaction, TransactionScope
from agentruns.domain.errors import (
    AgentRunsError,
    DatabaseTimeout,
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
    "guard_agent_run_result": "a result is written with the run's end",
    "guard_agent_run_event": "events are appended under the run's current lease, never rewritten",
    "guard_agent_run_reason": "an unknown end reason",
    "guard_agent_run_lease": "a lease is longer than zero",
    "guard_agent_run_queued": "a queued run has no holder, lease or end",
    "guard_agent_run_leased": "a leased run has a holder and a lease",
    "guard_agent_run_ended": "an ended run has a reason and an end time, and no lease",
    "uq_agent_run_head": "a subject has one head run (its leased run, or its first queued one)",
    "ck_agent_run_head": "a leased run is its subject's head, an ended run is not",
    "guard_agent_run_head": "only its subject's head is leased or flagged head (subject FIFO)",
    "guard_agent_subject_head": "a subject's head is named by the runs' triggers only",
    "agent_run_pkey": "a run with this id exists already",
    "guard_agent_sandbox": "the sandbox's state table or identity",
    "guard_agent_sandbox_times": "a sandbox's first call is kept and its last use never goes back",
    "uq_agent_sandbox_live_subject": "at most one live sandbox per subject",
    "uq_agent_sandbox_claim_name": "a sandbox with this claim exists already",
    "agent_sandbox_pkey": "a sandbox with this id exists already",
}


def translate(exc: BaseException, timeout: float | None = None) -> AgentRunsError:
    """The agentruns error a driver error means (the caller raises it ``from exc``);
    ``timeout`` is the statement_timeout the statement ran under, if one was set."""
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
    if isinstance(orig, psycopg.errors.LockNotAvailable):
        detail = " ".join(str(orig).split())
        return DatabaseTimeout(f"PostgreSQL gave up waiting for a lock: {detail}")
    if isinstance(orig, psycopg.errors.QueryCanceled):
        # A statement_timeout ran out (or someone cancelled the statement).
        detail = " ".join(str(orig).split())
        within = "" if timeout is None else f" after {timeout:g} s"
        return DatabaseTimeout(f"PostgreSQL cancelled a statement{within}: {detail}", timeout)
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
        *,
        prepare: bool = True,
        bound: float | None = None,
        timeout: float | None = None,
    ) -> None:
        self._connection = connection
        self._driver = driver
        self.prepare = prepare
        """Whether the adapter's statements are prepared on the server (not through a
        transaction pooler)."""
        self.bound = bound
        """Seconds each of the adapter's statements may take (the client's bound), or None."""
        self.timeout = timeout
        """The transaction's statement_timeout in seconds (SET LOCAL), or None."""

    @property
    def autocommitted(self) -> bool:
        """Whether this is an autocommitted statement scope: each statement its own
        transaction, its locks held only while it runs."""
        return self._connection is None

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
    if tx.bound is None:
        await cursor.execute(query, values, prepare=tx.prepare)
        return cursor
    # The client's bound: a cancelled wait makes psycopg cancel the statement on the server
    # (and wait for it to stop), so neither side is left running it. It costs a timer per
    # statement, not a round trip, and holds the same through a pooler.
    try:
        async with asyncio.timeout(tx.bound):
            await cursor.execute(query, values, prepare=tx.prepare)
    except TimeoutError:
        raise DatabaseTimeout(
            f"the database did not finish a statement within {tx.bound:g} s: it was cancelled",
            tx.bound,
        ) from None
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
        raise translate(exc, getattr(tx, "timeout", None)) from exc


async def execute(tx: Transaction, statement: TextClause, params: Mapping[str, Any]) -> int:
    """Run ``statement`` in ``tx`` for its effect; the number of rows it touched."""
    try:
        return (await _run(tx, statement, params)).rowcount
    except (psycopg.Error, OSError, ValueError) as exc:
        raise translate(exc, getattr(tx, "timeout", None)) from exc


# Through a transaction pooler the plan_cache_mode SETs are skipped: a session SET would land
# on a server connection that another client gets next. That is acceptable: without prepared
# statements every statement the adapter sends is unnamed, parsed and planned afresh at each
# execution with its parameters, so plan_cache_mode (which chooses among a prepared
# statement's plans) has nothing to decide for them. The statements inside agent_claim (a
# plpgsql function, whose plans each server connection caches) then follow the server's own
# plan_cache_mode: a custom plan for their first five runs on it, as PostgreSQL does by
# default. An operator who wants the generic plan there sets it on agentruns' role
# (ALTER ROLE ... SET plan_cache_mode = force_generic_plan), which a pooler cannot leak.
_PLAN_ONCE = "SET plan_cache_mode = force_generic_plan"


async def _configure(connection: psycopg.AsyncConnection[Any]) -> None:
    """A statement connection's settings: as :func:`_plan_once`, on a bare psycopg connection."""
    await connection.execute(_PLAN_ONCE)


def _plan_once(dbapi_connection: Any, _record: object) -> None:
    """Run prepared statements on their generic plan from the first execution: the adapter's
    statements are shaped for it (one SQL text for the pinned and the database clock, partial
    indexes chosen whatever the parameters), and PostgreSQL's default plans five custom plans
    per statement and connection before it tries the generic one (ADRs/0011)."""
    cursor = dbapi_connection.cursor()
    cursor.execute(_PLAN_ONCE)
    cursor.close()
    dbapi_connection.commit()


class PostgresDatabase(TransactionScope):
    """An async engine (psycopg 3) and its pool; the transaction scope of the PostgreSQL stores.

    ``clock=None`` decides every time on the database clock; a pinned :class:`Clock` (tests) is
    handed to each statement as its ``now`` instead, with the same SQL text. ``options`` are
    the process's connection options (its name, the pooler, the time bounds); the URL's
    ``agentruns_pooler=`` overrides their pooler.
    """

    def __init__(
        self,
        url: str,
        clock: Clock | None = None,
        *,
        pool_size: int = 5,
        max_overflow: int = 10,
        engine: AsyncEngine | None = None,
        options: ConnectionOptions | None = None,
    ) -> None:
        self.url = url
        self.clock = clock
        self.options = (options or ConnectionOptions()).on(url)
        # READ COMMITTED whatever the server's default: the head bookkeeping relies on each
        # statement of its triggers seeing every commit before it (ADRs/0004, ADRs/0017).
        self.engine = engine or create_async_engine(
            sqlalchemy_url(url),
            pool_size=pool_size,
            max_overflow=max_overflow,
            isolation_level="READ COMMITTED",
            connect_args=self.options.connect_kwargs(),
        )
        if self.options.prepares:
            event.listen(self.engine.sync_engine, "connect", _plan_once)
        timeout = self.options.local_statement_timeout
        # Transaction-scoped, so it holds through a transaction pooler and ends with the
        # transaction (milliseconds: the server's unit, whole so the text stays one literal).
        self._set_local_timeout = (
            None
            if timeout is None
            else f"SET LOCAL statement_timeout = {max(1, round(timeout * 1000))}"
        )
        # Autocommitted statements (a claim of plain kinds, a group of ends) check out bare
        # psycopg connections from a small pool of their own, one per event loop: SQLAlchemy's
        # checkout, isolation switch and reset cost more client time than the statement.
        self._statement_pool_size = max(2, min(pool_size, 8))
        self._statement_pools: dict[asyncio.AbstractEventLoop, AsyncConnectionPool] = {}

    def now_param(self) -> datetime | None:
        """The ``now`` bound into statements: the pinned clock's, or None for ``now()``."""
        return None if self.clock is None else self.clock.now()

    def _scope(
        self,
        connection: AsyncConnection | None,
        driver: psycopg.AsyncConnection[Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> PostgresTransaction:
        return PostgresTransaction(
            connection,
            driver,
            prepare=self.options.prepares,
            bound=self.options.statement_bound,
            timeout=timeout,
        )

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PostgresTransaction]:
        try:
            async with self.engine.begin() as connection:
                tx = self._scope(connection, timeout=self.options.local_statement_timeout)
                if self._set_local_timeout is not None:
                    await (await tx.driver()).execute(self._set_local_timeout, prepare=False)
                yield tx
        except (SQLAlchemyError, psycopg.Error, OSError) as exc:
            raise translate(exc) from exc

    @asynccontextmanager
    async def statement(self) -> AsyncIterator[PostgresTransaction]:
        # Autocommit: psycopg sends no BEGIN and no COMMIT, so a claim or a group end costs one
        # round trip, as the raw queue's statements do (ADRs/0017). No SET LOCAL here (there is
        # no transaction to scope it to): the client's bound is what limits these.
        try:
            pool = await self._statement_pool()
            async with pool.connection() as connection:
                yield self._scope(None, connection)
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
                kwargs={"autocommit": True, **self.options.connect_kwargs()},
                configure=_configure if self.options.prepares else None,
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
