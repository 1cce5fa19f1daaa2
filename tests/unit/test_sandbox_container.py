"""The composition root builds the sandbox use cases from what the host provides."""

from __future__ import annotations

from datetime import timedelta

import pytest
from dependency_injector import errors, providers

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.memory import MemorySandboxClaims, MemorySandboxStore
from agentruns.adapters.tokens import JwtSandboxTokens, SigningKey
from agentruns.app.container import AgentRunsContainer
from agentruns.app.sandboxes import AgentSandboxKind
from agentruns.app.settings import AgentRunsSettings
from agentruns.domain.sandbox import SandboxState
from tests.strategies import EPOCH


def container(clock: ManualClock) -> AgentRunsContainer:
    built = AgentRunsContainer()
    built.clock.override(providers.Object(clock))
    built.settings.override(providers.Object(AgentRunsSettings(sandbox_idle=timedelta(minutes=5))))
    return built


async def test_the_memory_profile_wires_sandboxes_to_the_runs_family() -> None:
    """ensure, a gateway call and the reaper all meet in the one memory family."""
    clock = ManualClock(EPOCH)
    built = container(clock)
    claims = MemorySandboxClaims()
    key = SigningKey("k", b"k" * 32, not_after=EPOCH + timedelta(days=1))
    built.sandbox_claims.override(providers.Object(claims))
    built.sandbox_tokens.override(providers.Object(JwtSandboxTokens([key], clock)))
    built.sandbox_kinds.override(
        providers.Object([AgentSandboxKind("coder", runs=(), warm_pool="pool")])
    )
    built.gateway_url.override(providers.Object("http://10.0.0.7:8081"))
    assert isinstance(built.sandbox_store(), MemorySandboxStore)
    sandboxes = built.sandboxes()
    sandbox = await sandboxes.ensure("coder", workspace="ws", subject="s")
    body = claims.body(sandbox.claim_name)
    assert body is not None
    token = body["spec"]["env"][0]["value"]  # type: ignore[index,call-overload]
    assert (await sandboxes.call(str(token))).state is SandboxState.READY
    clock.advance(timedelta(minutes=4))
    assert (await built.sandbox_reaper().tick()).taken_back == []
    clock.advance(timedelta(minutes=1))
    assert [s.id for s in (await built.sandbox_reaper().tick()).taken_back] == [sandbox.id]


def test_sandboxes_need_the_hosts_claims_and_tokens() -> None:
    """Without the cluster and the keys the container refuses clearly, at first use."""
    with pytest.raises(errors.Error):
        container(ManualClock(EPOCH)).sandboxes()
