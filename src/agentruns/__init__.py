"""agentruns: durable leases of long-running AI-agent work on PostgreSQL.

Everything a host uses is a name of this package (``__all__``, pinned by a test); a host's tests
use :mod:`agentruns.testing` too. Any other module may move. ::

    import asyncio
    import agentruns

    async def main() -> None:
        async with agentruns.connect(kinds=KINDS) as client:   # the embedded PostgreSQL
            await client.runs.enqueue("review", workspace="acme", subject="pull-request:42")

    asyncio.run(main())

Importing agentruns opens no connection, reads no environment and imports no driver: each name
is loaded from its module the first time it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Each public name and the module it lives in (loaded on first use).
_HOMES: dict[str, str] = {
    # Connecting, settings, migrations
    "connect": "agentruns.entrypoints.connect",
    "AgentRunsClient": "agentruns.entrypoints.connect",
    "AgentRunsSettings": "agentruns.entrypoints.settings",
    "migrate": "agentruns.adapters.postgres.migrate",
    "MigrationChain": "agentruns.adapters.postgres.migrate",
    # Kinds, their handlers and steps
    "RunKind": "agentruns.app.kinds",
    "RunKinds": "agentruns.app.kinds",
    "StepEvent": "agentruns.app.kinds",
    "RunResult": "agentruns.app.kinds",
    "Usage": "agentruns.domain.usage",
    "Budget": "agentruns.domain.budgets",
    "BudgetView": "agentruns.domain.budgets",
    "Spend": "agentruns.domain.usage",
    "Steps": "agentruns.app.kinds",
    "RecordedSteps": "agentruns.app.recorded",
    "StepContext": "agentruns.app.recorded",
    "AgentRunHandler": "agentruns.app.kinds",
    "NoDomainRow": "agentruns.app.kinds",
    "RunKindPolicy": "agentruns.domain.kinds",
    "OnActive": "agentruns.domain.subject_policy",
    "Backoff": "agentruns.domain.backoff",
    "RandomSource": "agentruns.domain.backoff",
    "Band": "agentruns.domain.bands",
    # Runs, their events and what a handler sees
    "AgentRun": "agentruns.domain.run",
    "AgentRunFence": "agentruns.domain.run",
    "RunChange": "agentruns.domain.run",
    "AgentRunState": "agentruns.domain.states",
    "TerminationReason": "agentruns.domain.termination",
    "RunOutcome": "agentruns.domain.termination",
    "JsonObject": "agentruns.domain.payload",
    "RunEvent": "agentruns.app.ports",
    "BudgetHold": "agentruns.app.ports",
    "Clock": "agentruns.app.ports",
    "Transaction": "agentruns.app.ports",
    "postgres_connection": "agentruns.adapters.postgres.database",
    # The use cases
    "AgentRuns": "agentruns.app.runs",
    "RunPage": "agentruns.app.runs",
    "Enqueued": "agentruns.app.runs",
    # Watching a run live (ADRs/0030)
    "RunUpdate": "agentruns.app.watch",
    "RunWaitTimedOut": "agentruns.domain.errors",
    # Durable waits (ADRs/0025)
    "Signal": "agentruns.domain.waits",
    "Delivered": "agentruns.domain.waits",
    # Signed approval links for a wait (ADRs/0027)
    "AgentApprovals": "agentruns.app.approvals",
    "ApprovalLink": "agentruns.app.approval_ports",
    "create_approvals": "agentruns.entrypoints.console.approve",
    "Worker": "agentruns.app.worker",
    "WorkerStats": "agentruns.app.worker",
    "AgentRunReaper": "agentruns.app.reaper",
    "ReapReport": "agentruns.app.reaper",
    # Failures a kind raises, and how they are classified
    "ProviderError": "agentruns.domain.failures",
    "ConfigurationError": "agentruns.domain.failures",
    "FallbackChainExhausted": "agentruns.domain.failures",
    "FailureClass": "agentruns.domain.failures",
    "classify": "agentruns.domain.failures",
    "ClassifiedFailure": "agentruns.domain.failures",
    "KindClassifier": "agentruns.domain.failures",
    # What a failed attempt leaves on its run (AgentRuns.failures, AgentRun.last_failure)
    "FailureRecord": "agentruns.domain.failure_records",
    "LastFailure": "agentruns.domain.failure_records",
    # Errors agentruns raises (the tree is in agentruns.domain.errors' docstring)
    "AgentRunsError": "agentruns.domain.errors",
    "InvalidRequest": "agentruns.domain.errors",
    "UnknownKind": "agentruns.domain.errors",
    "InvalidPayload": "agentruns.domain.errors",
    "InvalidRunResult": "agentruns.domain.errors",
    "InvalidBand": "agentruns.domain.errors",
    "InvalidDuration": "agentruns.domain.errors",
    "KeyConflict": "agentruns.domain.errors",
    "SubjectBusy": "agentruns.domain.errors",
    "IllegalTransition": "agentruns.domain.errors",
    "RunNotFound": "agentruns.domain.errors",
    "LeaseLost": "agentruns.domain.errors",
    "StaleEpoch": "agentruns.domain.errors",
    "LeaseExpired": "agentruns.domain.errors",
    "RetryBudgetExhausted": "agentruns.domain.errors",
    "RecordedStepError": "agentruns.domain.errors",
    "StepOutOfOrder": "agentruns.domain.errors",
    "InvalidStepResult": "agentruns.domain.errors",
    "StepTimedOut": "agentruns.domain.errors",
    "WaitTimedOut": "agentruns.domain.errors",
    "RunAlreadyEnded": "agentruns.domain.errors",
    "SandboxError": "agentruns.domain.errors",
    "SandboxNotLive": "agentruns.domain.errors",
    "InvalidToken": "agentruns.domain.errors",
    "StoreUnavailable": "agentruns.domain.errors",
    "TransactionConflict": "agentruns.domain.errors",
    "DatabaseTimeout": "agentruns.domain.errors",
    # Schedules declared with the kinds, and the scheduler any replica runs (ADRs/0015)
    "Schedule": "agentruns.domain.schedule",
    "Schedules": "agentruns.domain.schedule",
    "CatchUp": "agentruns.domain.schedule",
    "ScheduleState": "agentruns.domain.ticks",
    "AgentSchedules": "agentruns.app.schedules",
    "SyncReport": "agentruns.app.schedules",
    "ScheduleTick": "agentruns.app.schedule_ports",
    "AgentScheduler": "agentruns.app.scheduler",
    "SchedulerReport": "agentruns.app.scheduler",
    "InvalidSchedule": "agentruns.domain.errors",
    "ScheduleNotFound": "agentruns.domain.errors",
    # Provider limits shared by every worker of a database (ADRs/0032)
    "ProviderLimit": "agentruns.domain.provider_limits",
    "UnknownLimit": "agentruns.domain.errors",
    "LimitExhausted": "agentruns.domain.errors",
    # Sandboxes (the `k8s` and `gateway` extras; docs/sandboxes.md)
    "AgentSandbox": "agentruns.domain.sandbox",
    "AgentSandboxKind": "agentruns.app.sandboxes",
    "AgentSandboxes": "agentruns.app.sandboxes",
    "AgentSandboxReaper": "agentruns.app.sandbox_reaper",
    "SandboxHosting": "agentruns.entrypoints.container",
    "SigningKey": "agentruns.adapters.tokens",
    "KubernetesSandboxClaims": "agentruns.adapters.kubernetes.claims",
    "gateway_url_of": "agentruns.adapters.kubernetes.claims",
    "create_gateway": "agentruns.entrypoints.gateway",
    # The web console (the `console` extra; ADRs/0018)
    "ConsoleAccess": "agentruns.entrypoints.console.access",
    "create_console": "agentruns.entrypoints.console",
    # A run's live stream (Server-Sent Events) for a host's own API (ADRs/0030)
    "create_run_stream": "agentruns.entrypoints.stream",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'agentruns' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers see: the same names, eagerly, re-exported
    from agentruns.adapters.kubernetes.claims import (
        KubernetesSandboxClaims as KubernetesSandboxClaims,
        gateway_url_of as gateway_url_of,
    )
    from agentruns.adapters.postgres.database import (
        postgres_connection as postgres_connection,
    )
    from agentruns.adapters.postgres.migrate import (
        MigrationChain as MigrationChain,
        migrate as migrate,
    )
    from agentruns.adapters.tokens import (
        SigningKey as SigningKey,
    )
    from agentruns.app.approval_ports import ApprovalLink as ApprovalLink
    from agentruns.app.approvals import AgentApprovals as AgentApprovals
    from agentruns.app.kinds import (
        AgentRunHandler as AgentRunHandler,
        NoDomainRow as NoDomainRow,
        RunKind as RunKind,
        RunKinds as RunKinds,
        RunResult as RunResult,
        StepEvent as StepEvent,
        Steps as Steps,
    )
    from agentruns.app.ports import (
        BudgetHold as BudgetHold,
        Clock as Clock,
        RunEvent as RunEvent,
        Transaction as Transaction,
    )
    from agentruns.app.reaper import (
        AgentRunReaper as AgentRunReaper,
        ReapReport as ReapReport,
    )
    from agentruns.app.recorded import RecordedSteps as RecordedSteps, StepContext as StepContext
    from agentruns.app.runs import (
        AgentRuns as AgentRuns,
        Enqueued as Enqueued,
        RunPage as RunPage,
    )
    from agentruns.app.sandbox_reaper import (
        AgentSandboxReaper as AgentSandboxReaper,
    )
    from agentruns.app.sandboxes import (
        AgentSandboxes as AgentSandboxes,
        AgentSandboxKind as AgentSandboxKind,
    )
    from agentruns.app.schedule_ports import (
        ScheduleTick as ScheduleTick,
    )
    from agentruns.app.scheduler import (
        AgentScheduler as AgentScheduler,
        SchedulerReport as SchedulerReport,
    )
    from agentruns.app.schedules import (
        AgentSchedules as AgentSchedules,
        SyncReport as SyncReport,
    )
    from agentruns.app.watch import RunUpdate as RunUpdate
    from agentruns.app.worker import (
        Worker as Worker,
        WorkerStats as WorkerStats,
    )
    from agentruns.domain.backoff import (
        Backoff as Backoff,
        RandomSource as RandomSource,
    )
    from agentruns.domain.bands import (
        Band as Band,
    )
    from agentruns.domain.budgets import Budget as Budget, BudgetView as BudgetView
    from agentruns.domain.errors import (
        AgentRunsError as AgentRunsError,
        DatabaseTimeout as DatabaseTimeout,
        IllegalTransition as IllegalTransition,
        InvalidBand as InvalidBand,
        InvalidDuration as InvalidDuration,
        InvalidPayload as InvalidPayload,
        InvalidRequest as InvalidRequest,
        InvalidRunResult as InvalidRunResult,
        InvalidSchedule as InvalidSchedule,
        InvalidStepResult as InvalidStepResult,
        InvalidToken as InvalidToken,
        KeyConflict as KeyConflict,
        LeaseExpired as LeaseExpired,
        LeaseLost as LeaseLost,
        LimitExhausted as LimitExhausted,
        RecordedStepError as RecordedStepError,
        RetryBudgetExhausted as RetryBudgetExhausted,
        RunAlreadyEnded as RunAlreadyEnded,
        RunNotFound as RunNotFound,
        RunWaitTimedOut as RunWaitTimedOut,
        SandboxError as SandboxError,
        SandboxNotLive as SandboxNotLive,
        ScheduleNotFound as ScheduleNotFound,
        StaleEpoch as StaleEpoch,
        StepOutOfOrder as StepOutOfOrder,
        StepTimedOut as StepTimedOut,
        StoreUnavailable as StoreUnavailable,
        SubjectBusy as SubjectBusy,
        TransactionConflict as TransactionConflict,
        UnknownKind as UnknownKind,
        UnknownLimit as UnknownLimit,
        WaitTimedOut as WaitTimedOut,
    )
    from agentruns.domain.failure_records import (
        FailureRecord as FailureRecord,
        LastFailure as LastFailure,
    )
    from agentruns.domain.failures import (
        ClassifiedFailure as ClassifiedFailure,
        ConfigurationError as ConfigurationError,
        FailureClass as FailureClass,
        FallbackChainExhausted as FallbackChainExhausted,
        KindClassifier as KindClassifier,
        ProviderError as ProviderError,
        classify as classify,
    )
    from agentruns.domain.kinds import (
        RunKindPolicy as RunKindPolicy,
    )
    from agentruns.domain.payload import (
        JsonObject as JsonObject,
    )
    from agentruns.domain.provider_limits import (
        ProviderLimit as ProviderLimit,
    )
    from agentruns.domain.run import (
        AgentRun as AgentRun,
        AgentRunFence as AgentRunFence,
        RunChange as RunChange,
    )
    from agentruns.domain.sandbox import (
        AgentSandbox as AgentSandbox,
    )
    from agentruns.domain.schedule import (
        CatchUp as CatchUp,
        Schedule as Schedule,
        Schedules as Schedules,
    )
    from agentruns.domain.states import (
        AgentRunState as AgentRunState,
    )
    from agentruns.domain.subject_policy import OnActive as OnActive
    from agentruns.domain.termination import (
        RunOutcome as RunOutcome,
        TerminationReason as TerminationReason,
    )
    from agentruns.domain.ticks import (
        ScheduleState as ScheduleState,
    )
    from agentruns.domain.usage import Spend as Spend, Usage as Usage
    from agentruns.domain.waits import (
        Delivered as Delivered,
        Signal as Signal,
    )
    from agentruns.entrypoints.connect import (
        AgentRunsClient as AgentRunsClient,
        connect as connect,
    )
    from agentruns.entrypoints.console import (
        create_console as create_console,
    )
    from agentruns.entrypoints.console.access import (
        ConsoleAccess as ConsoleAccess,
    )
    from agentruns.entrypoints.console.approve import create_approvals as create_approvals
    from agentruns.entrypoints.container import (
        SandboxHosting as SandboxHosting,
    )
    from agentruns.entrypoints.gateway import (
        create_gateway as create_gateway,
    )
    from agentruns.entrypoints.settings import (
        AgentRunsSettings as AgentRunsSettings,
    )
    from agentruns.entrypoints.stream import create_run_stream as create_run_stream
