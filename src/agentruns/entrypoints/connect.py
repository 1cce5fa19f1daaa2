"""One way in: :func:`connect` gives a host agentruns composed and connected, ready to use.

::

    async with agentruns.connect(url, kinds=KINDS) as client:
        await client.runs.enqueue("review", workspace="acme", subject="pull-request:42")

With no URL (and no ``AGENTRUNS_DATABASE_URL``), it starts or joins the embedded PostgreSQL in
``.agentruns/pgdata``, as the command line does, and migrates it. What a host may swap is a
parameter here: the clock (a pinned clock is what every SQL statement reads), randomness, the
settings, and the whole adapter family (the memory stores, for instance). Nothing is read or
connected until :func:`connect` is awaited or entered.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self
from uuid import UUID

from agentruns.adapters.embedded import EmbeddedPostgres
from agentruns.app.approvals import AgentApprovals
from agentruns.app.family import AdapterFamily
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.ports import Clock
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.sandbox_reaper import AgentSandboxReaper
from agentruns.app.sandboxes import AgentSandboxes
from agentruns.app.scheduler import AgentScheduler
from agentruns.app.schedules import AgentSchedules
from agentruns.app.worker import Worker
from agentruns.domain.backoff import RandomSource
from agentruns.domain.errors import StoreUnavailable
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.container import AgentRunsContainer, SandboxHosting, default_holder
from agentruns.entrypoints.settings import AgentRunsSettings

if TYPE_CHECKING:
    from agentruns.adapters.postgres.connections import ConnectionOptions
    from agentruns.adapters.tokens import SigningKey

DEFAULT_DATA_DIR = Path(".agentruns/pgdata")

log = logging.getLogger("agentruns.connect")


class AgentRunsClient:
    """agentruns composed over one adapter family: the use cases a host calls, and what it
    holds (a connection pool, a listening connection, the embedded server) until :meth:`close`.

    ``runs`` is the only writer of runs (:class:`~agentruns.app.runs.AgentRuns`); ``worker()``
    and ``reaper()`` build the processes' loops over the same stores and kinds.
    """

    def __init__(
        self,
        container: AgentRunsContainer,
        *,
        url: str | None,
        server: EmbeddedPostgres | None = None,
    ) -> None:
        self._container = container
        self._server = server
        self._closed = False
        self.url = url
        """The PostgreSQL URL in use (``None`` for a family given by the caller)."""

    @property
    def runs(self) -> AgentRuns:
        runs: AgentRuns = self._container.runs()
        return runs

    @property
    def kinds(self) -> RunKinds:
        """The registered kinds; :meth:`RunKinds.register` adds one before workers start."""
        kinds: RunKinds = self._container.kinds()
        return kinds

    @property
    def settings(self) -> AgentRunsSettings:
        settings: AgentRunsSettings = self._container.settings()
        return settings

    @property
    def clock(self) -> Clock:
        clock: Clock = self._container.clock()
        return clock

    @property
    def family(self) -> AdapterFamily:
        """The adapter family every use case here shares (its stores, sandbox store, stats)."""
        family: AdapterFamily = self._container.family()
        return family

    def worker(
        self,
        *,
        holder: str | None = None,
        concurrency: int | None = None,
        kinds: Sequence[str] | None = None,
    ) -> Worker:
        """A new worker over these runs: ``await worker.run(stop)`` claims and drives runs until
        ``stop`` is set; ``await worker.claim_and_drive(n)`` does one round. ``kinds`` limits
        the kinds it claims (every registered kind by default)."""
        options: dict[str, object] = {"holder": holder or default_holder()}
        if concurrency is not None:
            options["concurrency"] = concurrency
        if kinds is not None:
            options["only_kinds"] = [self.kinds.get(name).name for name in kinds]
        worker: Worker = self._container.worker(**options)
        return worker

    def reaper(self) -> AgentRunReaper:
        """The reaper over these runs: ``await reaper.run(stop, every=...)`` on every replica."""
        reaper: AgentRunReaper = self._container.reaper()
        return reaper

    @property
    def schedules(self) -> AgentSchedules:
        """The schedules the kinds declare, as the table keeps them: ``sync()`` (what the
        worker and reaper commands do on start), ``all()``, ``pause(name)``, ``resume(name)``."""
        schedules: AgentSchedules = self._container.schedules()
        return schedules

    def scheduler(self) -> AgentScheduler:
        """The scheduler over these kinds: ``await scheduler.run(stop, every=...)`` on any
        number of replicas enqueues each due tick once (ADRs/0015)."""
        scheduler: AgentScheduler = self._container.scheduler()
        return scheduler

    @property
    def sandboxes(self) -> AgentSandboxes:
        """Sandboxes of the hosting given to :func:`connect` (``sandboxes=``)."""
        self._require_sandboxes()
        sandboxes: AgentSandboxes = self._container.sandboxes()
        return sandboxes

    def sandbox_reaper(self) -> AgentSandboxReaper:
        self._require_sandboxes()
        reaper: AgentSandboxReaper = self._container.sandbox_reaper()
        return reaper

    @property
    def signs_approvals(self) -> bool:
        """Whether this client has signing keys for approval links (``approval_keys``, or a
        sandbox hosting's)."""
        return bool(self._container.signs_approvals())

    @property
    def approvals(self) -> AgentApprovals:
        """Signed approval links over the hosting's keys (ADRs/0027): made here, answered by
        the console's ``/approve`` pages or :func:`~agentruns.create_approvals`."""
        if not self.signs_approvals:
            raise StoreUnavailable(
                "no signing keys for approval links: pass approval_keys=[SigningKey(...)] "
                "(or sandboxes=SandboxHosting(...)) to connect"
            )
        approvals: AgentApprovals = self._container.approvals()
        return approvals

    async def approval_link(
        self, run_id: UUID, name: str, *, base_url: str, expires_at: datetime | None = None
    ) -> str:
        """A single-use URL under ``base_url`` that approves or rejects the run's wait for the
        signal ``name`` (see :meth:`AgentApprovals.link`)."""
        return await self.approvals.link(run_id, name, base_url=base_url, expires_at=expires_at)

    def _require_sandboxes(self) -> None:
        if not self._container.sandbox_kinds():
            raise StoreUnavailable("no sandboxes: pass sandboxes=SandboxHosting(...) to connect")

    async def close(self) -> None:
        """Release the pool and the listening connection, and let go of the embedded server
        (it stops when no other process holds it). Closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._container.family().close()
        finally:
            if self._server is not None:
                await asyncio.to_thread(self._server.stop)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


@dataclass
class Connecting:
    """What :func:`connect` returns: await it for a client, or enter it (``async with``) for
    one that is closed when the block ends."""

    url: str | None
    kinds: RunKinds
    settings: AgentRunsSettings | None
    clock: Clock | None
    rng: RandomSource | None
    family: AdapterFamily | None
    migrate: bool | None
    data_dir: Path | None
    sandboxes: SandboxHosting | None
    gateway_url: str
    application_name: str = "agentruns"
    approval_keys: Sequence[SigningKey] = ()
    _client: AgentRunsClient | None = field(default=None, init=False)

    def __await__(self) -> Generator[object, None, AgentRunsClient]:
        return self._open().__await__()

    async def __aenter__(self) -> AgentRunsClient:
        self._client = await self._open()
        return self._client

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._client is not None:
            await self._client.close()

    async def _open(self) -> AgentRunsClient:
        settings = self.settings or AgentRunsSettings()
        pool_size = settings.worker_concurrency + 2
        if self.family is not None:
            if self.url is not None:
                raise ValueError("connect takes a URL or a family, not both")
            return self._client_over(self.family, settings, url=None)
        url = self.url or settings.database_url
        server: EmbeddedPostgres | None = None
        if url is None:
            server = EmbeddedPostgres(self.data_dir or DEFAULT_DATA_DIR)
            url = await asyncio.to_thread(server.start)
        options = composition.connection_options(settings, self.application_name)
        try:
            # Every connection opened from here on starts in the settings' schema.
            url = composition.in_schema(url, settings.database_schema)
            # The embedded server is a private development database: migrate it by default.
            # A server the caller names is migrated only when asked, and checked otherwise.
            migrating = self.migrate if self.migrate is not None else server is not None
            if migrating:
                await asyncio.to_thread(
                    composition.upgrade_database,
                    url,
                    settings,
                    options=options,
                    retrying=log.warning,
                )
            else:
                await asyncio.to_thread(_check_schema, url, options)
            from agentruns.adapters.postgres import PostgresFamily

            family = PostgresFamily(url, self.clock, pool_size=pool_size, options=options)
        except BaseException:
            if server is not None:
                await asyncio.to_thread(server.stop)
            raise
        settings = settings.model_copy(update={"database_url": url})
        return self._client_over(family, settings, url=url, server=server)

    def _client_over(
        self,
        family: AdapterFamily,
        settings: AgentRunsSettings,
        *,
        url: str | None,
        server: EmbeddedPostgres | None = None,
    ) -> AgentRunsClient:
        built = composition.compose(
            family,
            kinds=self.kinds,
            settings=settings,
            clock=self.clock,
            rng=self.rng,
            sandboxes=self.sandboxes,
            gateway_url=self.gateway_url,
            approval_keys=self.approval_keys,
        )
        return AgentRunsClient(built, url=url, server=server)


def _check_schema(url: str, options: ConnectionOptions) -> None:
    composition.check_database(
        url, options, upgrade="run `agentruns db upgrade` (or connect with migrate=True)"
    )


def connect(
    url: str | None = None,
    *,
    kinds: RunKinds | Iterable[RunKind] = (),
    settings: AgentRunsSettings | None = None,
    clock: Clock | None = None,
    rng: RandomSource | None = None,
    family: AdapterFamily | None = None,
    migrate: bool | None = None,
    data_dir: str | Path | None = None,
    sandboxes: SandboxHosting | None = None,
    gateway_url: str = "",
    application_name: str = "agentruns",
    approval_keys: Sequence[SigningKey] = (),
) -> Connecting:
    """agentruns on the PostgreSQL at ``url``, ready to use once awaited or entered.

    - ``url``: a ``postgresql://`` URL; ``None`` takes ``AGENTRUNS_DATABASE_URL``, and without
      it the embedded PostgreSQL in ``data_dir`` (default ``.agentruns/pgdata``, the command
      line's), started or joined and let go of on close.
    - ``kinds``: a :class:`RunKinds` or the kinds to register.
    - ``migrate``: bring the schema to the newest revision first. Default: yes on the embedded
      server; on a named server, no, and a schema that is not migrated is refused with
      :class:`~agentruns.domain.errors.StoreUnavailable`.
    - ``clock``: the time every statement reads (a ``ManualClock`` in tests); default the
      database clock. ``rng``: the randomness of backoff jitter. ``settings``: default
      ``AgentRunsSettings()`` from the ``AGENTRUNS_*`` environment; its ``database_schema``
      (``AGENTRUNS_SCHEMA``) is the schema every connection uses and a migration creates.
    - ``family``: an adapter family to use instead of PostgreSQL (for instance
      ``MemoryFamily(clock)``); then no URL.
    - ``sandboxes`` and ``gateway_url``: the host's sandbox kinds, keys and claims adapter.
    - ``approval_keys``: the keys approval links are signed with (ADRs/0027), for a host
      without sandboxes; with a sandbox hosting and none given, its keys sign them.
    - ``application_name``: what the client's connections are called in ``pg_stat_activity``
      (cut to 63 bytes), so an operator sees which process holds them.

    The settings' ``pooler``, ``listen_url`` and ``statement_timeout`` shape the connections
    (README, "In production").
    """
    registry = kinds if isinstance(kinds, RunKinds) else RunKinds(kinds)
    return Connecting(
        url=url,
        kinds=registry,
        settings=settings,
        clock=clock,
        rng=rng if rng is not None else random.Random(),
        family=family,
        migrate=migrate,
        data_dir=None if data_dir is None else Path(data_dir),
        sandboxes=sandboxes,
        gateway_url=gateway_url,
        application_name=application_name,
        approval_keys=tuple(approval_keys),
    )
