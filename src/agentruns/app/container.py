"""The composition root: the one module of the app that names adapters.

Hosts build a container, register their kinds, and take ``runs``, ``worker`` and ``reaper`` from
it; tests override providers (``container.clock.override(providers.Object(ManualClock()))``).
The ``profile`` chooses the adapter family: ``memory`` or ``postgres``.

Sandboxes need what only the host knows: it provides ``sandbox_claims`` (a
``KubernetesSandboxClaims`` over its cluster client), ``sandbox_tokens`` (its signing keys),
``sandbox_kinds`` and ``gateway_url``, then takes ``sandboxes`` and ``sandbox_reaper``.
"""

from __future__ import annotations

import random
import socket
import uuid

from dependency_injector import containers, providers

from agentruns.adapters.clock import SystemClock
from agentruns.adapters.memory import make_memory_stores
from agentruns.adapters.memory.sandboxes import memory_sandbox_store
from agentruns.adapters.postgres import make_postgres_stores
from agentruns.adapters.postgres.sandboxes import postgres_sandbox_store
from agentruns.app.kinds import RunKinds
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.sandbox_ports import SandboxClaims, SandboxTokens
from agentruns.app.sandbox_reaper import AgentSandboxReaper, sandbox_timings
from agentruns.app.sandboxes import AgentSandboxes
from agentruns.app.settings import AgentRunsSettings
from agentruns.app.worker import Worker


def default_holder() -> str:
    """A holder name that tells an operator which process holds a lease."""
    return f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"


class AgentRunsContainer(containers.DeclarativeContainer):
    settings = providers.Singleton(AgentRunsSettings)
    profile = providers.Object("memory")
    clock = providers.Singleton(SystemClock)
    rng = providers.Singleton(random.Random)
    kinds = providers.Singleton(RunKinds)

    stores = providers.Selector(
        profile,
        memory=providers.Singleton(make_memory_stores, clock=clock),
        # Every time decision on the database clock; the pool is sized for the worker's slots
        # plus the reaper and a claimer.
        postgres=providers.Singleton(
            make_postgres_stores,
            url=settings.provided.database_url,
            clock=None,
            pool_size=providers.Callable(
                lambda settings: settings.worker_concurrency + 2, settings
            ),
        ),
    )

    runs = providers.Singleton(
        AgentRuns,
        stores=stores,
        kinds=kinds,
        rng=rng,
        band_aging=settings.provided.band_aging,
    )
    reaper = providers.Singleton(
        AgentRunReaper,
        stores=stores,
        kinds=kinds,
        rng=rng,
        batch=settings.provided.reap_batch,
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
    )

    sandbox_store = providers.Selector(
        profile,
        memory=providers.Singleton(memory_sandbox_store, stores=stores, clock=clock),
        postgres=providers.Singleton(postgres_sandbox_store, stores=stores),
    )
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
    sandbox_reaper = providers.Singleton(
        AgentSandboxReaper,
        scope=stores.provided.scope,
        store=sandbox_store,
        claims=sandbox_claims,
        timings=providers.Callable(sandbox_timings, settings),
        batch=settings.provided.reap_batch,
    )
