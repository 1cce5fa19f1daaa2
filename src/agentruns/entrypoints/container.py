"""The composition root: the one module that names adapters and wires use cases to them.

Hosts do not use it directly: :func:`agentruns.connect` (and :mod:`agentruns.testing`) build a
container with :func:`compose`, which takes what a host may swap (the adapter family, the clock,
randomness, kinds, settings) as parameters, so no host overrides a provider. The command line
uses the ``profile`` (``memory`` or ``postgres``) and :func:`use_postgres`.

Sandboxes need what only the host knows: it provides ``sandbox_claims`` (a
``KubernetesSandboxClaims`` over its cluster client), ``sandbox_tokens`` (its signing keys),
``sandbox_kinds`` and ``gateway_url``, then takes ``sandboxes`` and ``sandbox_reaper``. The
commands take the first three as one :class:`SandboxHosting` (``--sandboxes module:object``).
"""

from __future__ import annotations

import asyncio
import random
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from dependency_injector import containers, providers

from agentruns.adapters import embedded
from agentruns.adapters.clock import SystemClock
from agentruns.adapters.embedded import EmbeddedPostgres, EmbeddedStatus
from agentruns.adapters.memory import MemoryFamily
from agentruns.app.approval_ports import ApprovalTokens
from agentruns.app.approvals import AgentApprovals
from agentruns.app.family import AdapterFamily
from agentruns.app.holders import AgentHolders, HolderHeartbeat
from agentruns.app.kinds import RunKinds
from agentruns.app.metrics import Metrics, NoMetrics
from agentruns.app.ports import Clock
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.sandbox_ports import SandboxClaims, SandboxTokens
from agentruns.app.sandbox_reaper import AgentSandboxReaper
from agentruns.app.sandboxes import AgentSandboxes, AgentSandboxKind
from agentruns.app.scheduler import AgentScheduler
from agentruns.app.schedules import AgentSchedules
from agentruns.app.tracing import NoTracing, Tracing
from agentruns.app.worker import Worker
from agentruns.domain.backoff import RandomSource
from agentruns.domain.errors import DatabaseTimeout, StoreUnavailable
from agentruns.domain.holders import HolderBeat
from agentruns.domain.sandbox import SandboxTimings
from agentruns.entrypoints.settings import AgentRunsSettings

if TYPE_CHECKING:
    from agentruns.adapters.postgres.connections import ConnectionOptions
    from agentruns.adapters.prometheus import MetricsServer
    from agentruns.adapters.tokens import SigningKey

# The PostgreSQL and Prometheus adapters are imported when first used, so a host on the memory
# profile imports no driver, and one installed without the `cli` extra imports no
# prometheus-client.


def postgres_family(
    url: str | None, pool_size: int, options: ConnectionOptions | None = None
) -> AdapterFamily:
    """The PostgreSQL family at ``url``: every time decision on the database clock."""
    from agentruns.adapters.postgres import PostgresFamily

    return PostgresFamily(url, None, pool_size=pool_size, options=options)


# -- connections ------------------------------------------------------------------------------

# The processes a connection names (pg_stat_activity's application_name); any other is
# plain "agentruns" (a host's own process, through agentruns.connect).
PROCESSES = ("worker", "reaper", "console", "gateway", "scheduler", "cli")


def process_name(process: str | None = None, holder: str | None = None) -> str:
    """What a process's connections are named: ``agentruns-worker:host:1a2b3c4d`` for a
    worker and its holder, ``agentruns-cli``, or ``agentruns`` for any other (cut to 63 bytes
    where they connect)."""
    name = f"agentruns-{process}" if process in PROCESSES else "agentruns"
    return name if not holder else f"{name}:{holder}"


def _seconds(bound: timedelta) -> float | None:
    """A time bound of the settings in seconds; 0 (or less) is no bound."""
    seconds = bound.total_seconds()
    return seconds if seconds > 0 else None


def connection_options(
    settings: AgentRunsSettings, name: str = "agentruns", *, bounded_reads: bool = False
) -> ConnectionOptions:
    """The connections of a process named ``name``, from the settings: the pooler, the
    listener's URL, the statement bound on every statement, and with ``bounded_reads`` (the
    console and the command line) the read timeout on every transaction."""
    from agentruns.adapters.postgres.connections import ConnectionOptions

    return ConnectionOptions(
        application_name=name,
        pooler=settings.pooler,
        statement_bound=_seconds(settings.statement_timeout),
        local_statement_timeout=_seconds(settings.read_timeout) if bounded_reads else None,
        listen_url=settings.listen_url,
        poll_interval=settings.poll_interval.total_seconds(),
    )


def prometheus_metrics() -> Metrics:
    from agentruns.adapters.prometheus import PrometheusMetrics

    return PrometheusMetrics()


def otel_tracing() -> Tracing:
    """Spans to the global OpenTelemetry tracer provider (``AGENTRUNS_TRACING=otel``)."""
    try:
        from agentruns.adapters.otel import OtelTracing
    except ImportError as exc:
        raise StoreUnavailable(
            "AGENTRUNS_TRACING=otel needs OpenTelemetry: pip install 'agentruns[otel]'"
        ) from exc
    return OtelTracing()


def sandbox_timings(settings: AgentRunsSettings) -> SandboxTimings:
    """The take-back limits from the settings (``AGENTRUNS_SANDBOX_START`` and friends)."""
    return SandboxTimings(
        start=settings.sandbox_start,
        idle=settings.sandbox_idle,
        conversation_idle=settings.conversation_sandbox_idle,
    )


def default_holder() -> str:
    """A holder name that tells an operator which process holds a lease."""
    return f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"


def program_name() -> str:
    """The process name a host's worker shows among the holders: its program's."""
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"


class AgentRunsContainer(containers.DeclarativeContainer):
    settings = providers.Singleton(AgentRunsSettings)
    profile = providers.Object("memory")
    clock = providers.Singleton(SystemClock)
    rng = providers.Singleton(random.Random)
    kinds = providers.Singleton(RunKinds)

    # How the process's PostgreSQL connections are named and bounded: the command line
    # overrides it per command (support.postgres_container).
    connections = providers.Singleton(connection_options, settings)

    # The profile is chosen once: a family gives every store over one shared scope.
    family: providers.Provider[AdapterFamily] = providers.Selector(
        profile,
        memory=providers.Singleton(MemoryFamily, clock=clock),
        # The pool is sized for the worker's slots plus the reaper and a claimer.
        postgres=providers.Singleton(
            postgres_family,
            url=settings.provided.database_url,
            pool_size=providers.Callable(
                lambda settings: settings.worker_concurrency + 2, settings
            ),
            options=connections,
        ),
    )
    stores = family.provided.stores
    run_stats = family.provided.stats

    # "none" records nothing; "prometheus" counts into a registry a process can expose.
    metrics_backend = providers.Object("none")
    metrics = providers.Selector(
        metrics_backend,
        none=providers.Singleton(NoMetrics),
        prometheus=providers.Singleton(prometheus_metrics),
    )

    # "none" records nothing; "otel" makes spans for the OpenTelemetry tracer provider.
    tracing = providers.Selector(
        settings.provided.tracing,
        none=providers.Singleton(NoTracing),
        otel=providers.Singleton(otel_tracing),
    )

    runs = providers.Singleton(
        AgentRuns,
        stores=stores,
        kinds=kinds,
        rng=rng,
        band_aging=settings.provided.band_aging,
        tracing=tracing,
        metrics=metrics,
    )
    reaper = providers.Singleton(
        AgentRunReaper,
        stores=stores,
        kinds=kinds,
        rng=rng,
        batch=settings.provided.reap_batch,
        metrics=metrics,
    )
    worker = providers.Factory(
        Worker,
        runs=runs,
        kinds=kinds,
        notifier=stores.provided.notifier,
        rng=rng,
        holder=providers.Callable(default_holder),
        concurrency=settings.provided.worker_concurrency,
        poll_interval=providers.Callable(
            lambda settings: settings.poll_interval.total_seconds(), settings
        ),
        metrics=metrics,
        tracing=tracing,
        holders=family.provided.holders,
        renewal=settings.provided.lease_renewal,
        process=providers.Callable(program_name),
        cancel_grace=providers.Callable(
            lambda settings: settings.cancel_grace.total_seconds(), settings
        ),
    )
    # Who holds what, for `agentruns status` and the console.
    holders = providers.Singleton(
        AgentHolders,
        scope=stores.provided.scope,
        runs=stores.provided.runs,
        store=family.provided.holders,
        stats=run_stats,
        renewal=settings.provided.lease_renewal,
    )

    # Schedules: synced from the kinds' declarations, ticked by any replica's scheduler.
    schedule_store = family.provided.schedules
    schedules = providers.Singleton(AgentSchedules, runs=runs, store=schedule_store)
    scheduler = providers.Singleton(
        AgentScheduler,
        runs=runs,
        store=schedule_store,
        tick_retention=settings.provided.schedule_tick_retention,
    )

    sandbox_store = family.provided.sandboxes
    sandbox_claims: providers.Dependency[SandboxClaims] = providers.Dependency()
    sandbox_tokens: providers.Dependency[SandboxTokens] = providers.Dependency()
    sandbox_kinds = providers.Object(())
    gateway_url = providers.Dependency(instance_of=str)
    sandboxes = providers.Singleton(
        AgentSandboxes,
        scope=stores.provided.scope,
        store=sandbox_store,
        claims=sandbox_claims,
        tokens=sandbox_tokens,
        kinds=sandbox_kinds,
        gateway_url=gateway_url,
    )
    # Approval links (ADRs/0027) are signed with the hosting's keys, for their own audience.
    approval_tokens: providers.Dependency[ApprovalTokens] = providers.Dependency()
    approvals = providers.Singleton(AgentApprovals, runs=runs, tokens=approval_tokens)
    signs_approvals = providers.Object(False)
    sandbox_reaper = providers.Singleton(
        AgentSandboxReaper,
        scope=stores.provided.scope,
        store=sandbox_store,
        claims=sandbox_claims,
        timings=providers.Callable(sandbox_timings, settings),
        batch=settings.provided.reap_batch,
    )


def compose(
    family: AdapterFamily | None = None,
    *,
    kinds: RunKinds | None = None,
    settings: AgentRunsSettings | None = None,
    clock: Clock | None = None,
    rng: RandomSource | None = None,
    sandboxes: SandboxHosting | None = None,
    gateway_url: str = "",
    approval_keys: Sequence[SigningKey] = (),
) -> AgentRunsContainer:
    """A container over ``family`` (else the settings' profile), with these kinds, settings,
    clock and randomness in place of the defaults (the system clock, a fresh ``Random``).
    Approval links (ADRs/0027) are signed with ``approval_keys``, else with the sandbox
    hosting's keys.

    The clock given here is what the memory family reads and what sandbox tokens are checked
    on; a PostgreSQL family reads the clock it was built with (the database's unless pinned).
    """
    built = AgentRunsContainer()
    if settings is not None:
        built.settings.override(providers.Object(settings))
    if clock is not None:
        built.clock.override(providers.Object(clock))
    if rng is not None:
        built.rng.override(providers.Object(rng))
    if kinds is not None:
        built.kinds.override(providers.Object(kinds))
    if family is not None:
        built.family.override(providers.Object(family))
    if sandboxes is not None:
        use_sandboxes(built, sandboxes, gateway_url=gateway_url)
    if approval_keys:
        use_approval_keys(built, approval_keys)
    return built


# Database administration for the command line: the CLI is app code and names no adapter, so
# the composition root hands it these.


@contextmanager
def embedded_database(data_dir: Path) -> Iterator[str]:
    """Start (or join) the embedded PostgreSQL in ``data_dir``; its URL while the block runs."""
    server = EmbeddedPostgres(data_dir)
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


def embedded_status(data_dir: Path) -> EmbeddedStatus:
    """Whether the embedded PostgreSQL of ``data_dir`` runs, where, and who holds it."""
    return embedded.status(data_dir)


def keep_embedded(data_dir: Path) -> str:
    """Start (or join) the embedded PostgreSQL of ``data_dir`` and keep it running after this
    process exits, until :func:`stop_embedded`; its URL."""
    server = EmbeddedPostgres(data_dir)
    url = server.start()
    server.keep()
    server.stop()
    return url


def stop_embedded(data_dir: Path) -> bool:
    """Stop the embedded PostgreSQL of ``data_dir``, whoever started it; False if it was not
    running."""
    return embedded.shutdown(data_dir)


def database_named(url: str, name: str) -> str:
    """The URL of database ``name`` on the server of ``url`` (the demo's, for one)."""
    from agentruns.adapters.postgres import admin

    return admin.with_database(url, name)


def shown_url(url: str) -> str:
    """``url`` with its password hidden."""
    from agentruns.adapters.postgres import admin

    return admin.shown_url(url)


def use_postgres(container: AgentRunsContainer, url: str) -> None:
    """Point ``container`` at the PostgreSQL server at ``url`` (every time on its clock)."""
    settings = container.settings()
    if settings.database_url != url:
        container.settings.override(
            providers.Object(settings.model_copy(update={"database_url": url}))
        )
    container.profile.override("postgres")


def in_schema(url: str, schema: str | None) -> str:
    """``url`` whose every connection starts with ``schema`` (``AGENTRUNS_SCHEMA``) as its
    search_path; ``url`` itself for ``None``."""
    from agentruns.adapters.postgres import search_path

    return search_path.in_schema(url, schema)


def grant_script(url: str, role: str, name: str) -> str:
    """The statements that give PostgreSQL role ``name`` what agentruns' ``role`` (owner,
    worker, reader) needs in the database of ``url``, in the schema its connections use."""
    from agentruns.adapters.postgres import grants

    chosen = grants.role_named(role)
    return grants.grant_script(chosen, name, grants.grants_for(url, chosen, name))


def apply_grants(url: str, role: str, name: str) -> list[str]:
    """Apply :func:`grant_script`'s statements on the database at ``url``, as its user; those
    left for an administrator."""
    from agentruns.adapters.postgres import grants

    chosen = grants.role_named(role)
    return grants.apply_grants(url, chosen, grants.grants_for(url, chosen, name))


def upgrade_database(
    url: str,
    settings: AgentRunsSettings | None = None,
    *,
    options: ConnectionOptions | None = None,
    retrying: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Migrate the schema at ``url`` to the newest revision; that revision.

    Under the settings' ``migration_lock_timeout``: a migration that would wait longer for a
    lock (a long transaction reading a table it alters) gives up and rolls back rather than
    queue every client of the table behind it, then tries again after 1, 2, 4... seconds, up
    to ``migration_attempts`` in all; ``retrying`` is told each time, in one line."""
    from agentruns.adapters.postgres import admin

    config = settings or AgentRunsSettings()
    lock_timeout = _seconds(config.migration_lock_timeout)
    attempts = config.migration_attempts
    for attempt in range(1, attempts + 1):
        try:
            return admin.upgrade(url, lock_timeout=lock_timeout, options=options)
        except DatabaseTimeout as waited:
            if attempt == attempts:
                raise DatabaseTimeout(
                    f"{waited} (attempt {attempt} of {attempts}; "
                    "AGENTRUNS_MIGRATION_LOCK_TIMEOUT and AGENTRUNS_MIGRATION_ATTEMPTS)",
                    waited.seconds,
                ) from waited
            delay = float(min(2 ** (attempt - 1), 30))
            if retrying is not None:
                retrying(f"{waited}; attempt {attempt} of {attempts}, trying again in {delay:g} s")
            sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


def database_revision(url: str, options: ConnectionOptions | None = None) -> tuple[str | None, str]:
    """The schema's current revision at ``url`` (``None``: never migrated) and the newest."""
    from agentruns.adapters.postgres import admin

    return admin.schema_revision(url, options)


def check_database(
    url: str,
    options: ConnectionOptions | None = None,
    *,
    upgrade: str = "run `agentruns db upgrade`",
) -> None:
    """Raise a one-line :class:`StoreUnavailable` unless ``url`` answers with a migrated schema;
    ``upgrade`` is what the line suggests for a schema that is missing or behind (a server that
    does not answer, or refuses the role, gets no such hint: migrating would not help)."""
    current, head = database_revision(url, options)
    if current is None:
        raise StoreUnavailable(f"the database has no agentruns schema yet: {upgrade}")
    if current != head:
        raise StoreUnavailable(
            f"the database schema is at revision {current}, not {head}: {upgrade}"
        )


def fresh_database(url: str, name: str) -> str:
    """Drop and create database ``name`` on the server at ``url``; the new database's URL."""
    from agentruns.adapters.postgres import admin

    return admin.recreate_database(url, name)


async def close(container: AgentRunsContainer) -> None:
    """Release what the container's stores hold (a PostgreSQL pool and listener)."""
    await container.family().close()


def serve_metrics(
    container: AgentRunsContainer,
    port: int,
    host: str = "127.0.0.1",
    *,
    worker_slots: int | None = None,
) -> MetricsServer:
    """Expose the container's metrics (switched to the Prometheus backend) on ``host:port`` at
    ``/metrics``, with ``/healthz`` checking its database (200 when it answers, 503 when not);
    ``worker_slots``, the concurrency of the worker this process runs, for its free-slots gauge.
    Raises :class:`OSError` when the port cannot be bound."""
    from agentruns.adapters.prometheus import PrometheusMetrics, serve

    container.metrics_backend.override("prometheus")
    metrics = container.metrics()
    if not isinstance(metrics, PrometheusMetrics):
        raise TypeError("only the Prometheus metrics backend can be served")
    if worker_slots is not None:
        metrics.worker_slots(worker_slots)
    settings = container.settings()
    created = settings.metrics_created_series
    url = settings.database_url
    if container.profile() == "postgres" and url:
        options = container.connections()
        return serve(
            metrics, port, host, health=lambda: database_health(url, options), created=created
        )
    return serve(metrics, port, host, created=created)


def database_health(url: str, options: ConnectionOptions | None = None) -> None:
    """Return if the database at ``url`` answers a query now; raise StoreUnavailable if not."""
    from agentruns.adapters.postgres import admin

    admin.ping(url, options=options)


# Sandboxes for the commands: the gateway and the reaper take what only the host knows from one
# object, and the command line never names the adapters behind it.


@dataclass(frozen=True, slots=True)
class SandboxHosting:
    """What a host provides so the ``gateway`` and ``reaper`` commands can serve its sandboxes:
    its sandbox kinds, the keys its tokens are signed with (newest live key signs; every live key
    verifies), and the claims adapter of its cluster (``KubernetesSandboxClaims``, or
    ``MemorySandboxClaims`` in tests).

    The gateway URL a claim hands a new sandbox stays with the process that calls
    ``AgentSandboxes.ensure``: the gateway and the reaper create no claim.
    """

    kinds: Sequence[AgentSandboxKind]
    keys: Sequence[SigningKey]
    claims: SandboxClaims

    def __post_init__(self) -> None:
        # Checked here so a host's mistake is one line when the command starts, not at a call.
        object.__setattr__(self, "kinds", tuple(self.kinds))
        object.__setattr__(self, "keys", tuple(self.keys))
        names = [kind.name for kind in self.kinds]
        if not names:
            raise ValueError("sandbox hosting needs at least one sandbox kind")
        if len(set(names)) != len(names):
            raise ValueError(f"a sandbox kind is given twice among {sorted(names)}")
        kids = [key.kid for key in self.keys]
        if not kids:
            raise ValueError("sandbox hosting needs at least one signing key")
        if len(set(kids)) != len(kids):
            raise ValueError(f"a signing key id is given twice among {sorted(kids)}")


def use_sandboxes(
    container: AgentRunsContainer, hosting: SandboxHosting, *, gateway_url: str = ""
) -> None:
    """Provide the host's sandbox kinds, claims and keys to ``container`` (tokens on its clock).

    Without ``gateway_url`` the container serves and reaps sandboxes but creates none:
    ``AgentSandboxes.ensure`` refuses when it has no URL to hand a new sandbox.
    """
    from agentruns.adapters.tokens import JwtSandboxTokens

    container.sandbox_kinds.override(providers.Object(hosting.kinds))
    container.sandbox_claims.override(providers.Object(hosting.claims))
    container.sandbox_tokens.override(
        providers.Singleton(JwtSandboxTokens, list(hosting.keys), container.clock)
    )
    use_approval_keys(container, hosting.keys)
    container.gateway_url.override(providers.Object(gateway_url))


def use_approval_keys(container: AgentRunsContainer, keys: Sequence[SigningKey]) -> None:
    """Sign and check approval links (ADRs/0027) with ``keys``, on the container's clock."""
    from agentruns.adapters.tokens import JwtApprovalTokens

    if not keys:
        raise ValueError("approval links need at least one signing key")
    container.approval_tokens.override(
        providers.Singleton(JwtApprovalTokens, list(keys), container.clock)
    )
    container.signs_approvals.override(providers.Object(True))


async def serve_gateway(
    container: AgentRunsContainer,
    host: str,
    port: int,
    stop: asyncio.Event,
    started: Callable[[str], None],
) -> None:
    """Serve the sandbox gateway over ``container``'s use cases on ``host:port`` until ``stop``
    is set, then let calls in flight finish within ``shutdown_grace``. ``started`` gets the URL
    once the port is bound (``port`` 0 picks a free one); a port that cannot be bound raises
    :class:`OSError` before anything is served."""
    from agentruns.entrypoints.gateway import create_gateway, serve

    settings = container.settings()
    app = create_gateway(
        container.sandboxes(), container.runs(), body_timeout=settings.gateway_body_timeout
    )
    # The gateway is among the holders, with the run kinds its sandboxes claim: a kind only
    # sandboxes run is then not shown as one nobody runs. The leases are the sandboxes' own
    # (sandbox:<id>), judged by their renewals.
    sandbox_kinds: Sequence[AgentSandboxKind] = container.sandbox_kinds()
    runs = sorted({run for kind in sandbox_kinds for run in kind.runs})
    beat = HolderBeat(
        f"gateway:{default_holder()}", "agentruns-gateway", tuple(runs), settings.lease_renewal
    )
    heartbeat = HolderHeartbeat(container.stores().scope, container.family().holders, beat)
    async with heartbeat.kept():
        await serve(
            app, host, port, stop, started=started, grace=settings.shutdown_grace.total_seconds()
        )
