"""The composition root and the settings object."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from dependency_injector import providers
from pydantic import ValidationError

from agentruns.adapters.clock import ManualClock
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.entrypoints.container import AgentRunsContainer
from agentruns.entrypoints.settings import AgentRunsSettings


def test_settings_read_the_agentruns_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUNS_LEASE_RENEWAL", "45")
    monkeypatch.setenv("AGENTRUNS_BAND_AGING", "PT5M")
    monkeypatch.setenv("AGENTRUNS_DATABASE_URL", "postgresql://db/agentruns")
    settings = AgentRunsSettings()
    assert settings.lease_renewal == timedelta(seconds=45)
    assert settings.band_aging == timedelta(minutes=5)
    assert settings.database_url == "postgresql://db/agentruns"


def test_settings_default_to_the_designed_durations() -> None:
    settings = AgentRunsSettings()
    assert settings.band_aging == timedelta(minutes=10)
    assert settings.sandbox_start == timedelta(minutes=2)
    assert settings.sandbox_idle == timedelta(minutes=1)
    assert settings.conversation_sandbox_idle == timedelta(minutes=15)
    assert settings.worker_concurrency == 8


def test_provider_limits_are_a_setting_checked_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    assert AgentRunsSettings().limits == ""
    monkeypatch.setenv("AGENTRUNS_LIMITS", "openai/gpt-5=500rpm,2000000tpm")
    assert AgentRunsSettings().limits == "openai/gpt-5=500rpm,2000000tpm"
    monkeypatch.setenv("AGENTRUNS_LIMITS", "openai/gpt-5=500 a minute")
    with pytest.raises(ValueError, match="no amount"):
        AgentRunsSettings()


def test_a_workers_cancel_grace_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert AgentRunsContainer().worker(holder="w").keeper.grace == 5.0
    monkeypatch.setenv("AGENTRUNS_CANCEL_GRACE", "1.5")
    assert AgentRunsContainer().worker(holder="w").keeper.grace == 1.5


def test_a_bad_setting_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUNS_WORKER_CONCURRENCY", "0")
    with pytest.raises(ValidationError, match="worker_concurrency"):
        AgentRunsSettings()


async def test_the_container_composes_the_memory_profile_and_takes_overrides() -> None:
    """A test overrides the clock and kinds; the runs it gets use both."""

    async def steps(run: AgentRun):  # type: ignore[no-untyped-def]
        yield StepEvent("done")

    clock = ManualClock(datetime(2026, 5, 1, tzinfo=UTC))
    container = AgentRunsContainer()
    container.clock.override(providers.Object(clock))
    container.kinds.override(providers.Object(RunKinds([RunKind(RunKindPolicy("note"), steps)])))
    runs = container.runs()
    run = await runs.enqueue("note", workspace="acme", subject="s")
    assert run.enqueued_at == clock.now()
    assert container.runs() is runs
    worker = container.worker(holder="w")
    assert await worker.claim_and_drive(limit=4) == 1
    assert (await runs.get(run.id)).state is AgentRunState.ENDED
