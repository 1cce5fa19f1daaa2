"""The composition root builds the sandbox use cases from what the host provides."""

from __future__ import annotations

from datetime import timedelta

import pytest
from dependency_injector import errors, providers

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.memory import MemorySandboxClaims, MemorySandboxStore
from agentruns.adapters.tokens import JwtSandboxTokens, SigningKey
from agentruns.app.sandboxes import AgentSandboxKind
from agentruns.domain.errors import SandboxError
from agentruns.domain.sandbox import SandboxState
from agentruns.entrypoints.container import AgentRunsContainer, SandboxHosting, use_sandboxes
from agentruns.entrypoints.settings import AgentRunsSettings
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


def hosting(claims: MemorySandboxClaims | None = None) -> SandboxHosting:
    key = SigningKey("k", b"k" * 32, not_after=EPOCH + timedelta(days=1))
    coder = AgentSandboxKind("coder", runs=(), warm_pool="pool")
    return SandboxHosting(kinds=[coder], keys=[key], claims=claims or MemorySandboxClaims())


async def test_a_hosting_wires_kinds_claims_and_keys_into_the_container() -> None:
    """What the commands take from ``--sandboxes`` builds the same use cases a host wires."""
    clock = ManualClock(EPOCH)
    claims = MemorySandboxClaims()
    built = container(clock)
    use_sandboxes(built, hosting(claims), gateway_url="http://10.0.0.7:8081")
    sandbox = await built.sandboxes().ensure("coder", workspace="ws", subject="s")
    assert claims.body(sandbox.claim_name) is not None
    clock.advance(timedelta(minutes=2))
    assert [s.id for s in (await built.sandbox_reaper().tick()).taken_back] == [sandbox.id]


async def test_without_a_gateway_url_sandboxes_are_served_but_never_created() -> None:
    """The gateway and reaper commands create no claim, so ensure refuses before writing."""
    claims = MemorySandboxClaims()
    built = container(ManualClock(EPOCH))
    use_sandboxes(built, hosting(claims))
    with pytest.raises(SandboxError, match="no gateway URL"):
        await built.sandboxes().ensure("coder", workspace="ws", subject="s")
    assert claims.bodies == {}
    async with built.stores().scope.transaction() as tx:
        assert await built.sandbox_store().live_of_subject(tx, "ws", "s") is None


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"kinds": []}, "at least one sandbox kind"),
        ({"keys": []}, "at least one signing key"),
        (
            {"kinds": [AgentSandboxKind("a", (), "p"), AgentSandboxKind("a", (), "q")]},
            "given twice",
        ),
        (
            {"keys": [SigningKey("k", b"k" * 32, not_after=EPOCH)] * 2},
            "given twice",
        ),
    ],
)
def test_a_hosting_refuses_what_would_fail_at_a_call(
    changes: dict[str, object], fragment: str
) -> None:
    base = hosting()
    fields: dict[str, object] = {"kinds": base.kinds, "keys": base.keys, "claims": base.claims}
    with pytest.raises(ValueError, match=fragment):
        SandboxHosting(**{**fields, **changes})  # type: ignore[arg-type]
