"""The claim body refuses what the controller would trip on later."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from uuid import UUID

import pytest

from agentruns.adapters.kubernetes.manifest import claim_manifest
from agentruns.app.sandbox_ports import SandboxClaimSpec
from agentruns.app.sandboxes import AgentSandboxKind, claim_name_of
from tests.strategies import EPOCH

SPEC = SandboxClaimSpec(
    name=claim_name_of(UUID(int=1)),
    sandbox_id=UUID(int=1),
    warm_pool="pool",
    shutdown_at=EPOCH + timedelta(hours=1),
    token="t",
    gateway_url="http://10.0.0.1:8081",
)


def test_claim_names_are_dns_1035_labels() -> None:
    """sbx- and 32 hex digits: lower case, starts with a letter, 36 characters."""
    name = claim_name_of(UUID("F" * 32))
    assert name == "sbx-" + "f" * 32
    assert len(name) == 36


@pytest.mark.parametrize("name", ["Sbx-1", "1sbx", "sbx_1", "sbx-", "s" * 64])
def test_a_name_that_is_not_a_dns_1035_label_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="DNS-1035"):
        claim_manifest(replace(SPEC, name=name))


def test_a_naive_shutdown_or_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        claim_manifest(replace(SPEC, shutdown_at=datetime(2026, 1, 1)))
    with pytest.raises(ValueError, match="policy"):
        claim_manifest(replace(SPEC, shutdown_policy="Keep"))


def test_the_shutdown_time_is_rfc_3339_in_utc() -> None:
    """Whatever zone the time comes in, the body says it in UTC, to the second."""
    plus_two = EPOCH.astimezone(timezone(timedelta(hours=2))) + timedelta(microseconds=9)
    assert plus_two.hour == 2
    body = claim_manifest(replace(SPEC, shutdown_at=plus_two))
    assert body["spec"]["lifecycle"]["shutdownTime"] == "2026-01-01T00:00:00Z"  # type: ignore[index,call-overload]


def test_a_sandbox_kind_checks_itself() -> None:
    """A kind without a pool, with no lifetime or an unknown policy is refused when built."""
    with pytest.raises(ValueError, match="warm pool"):
        AgentSandboxKind("k", runs=(), warm_pool="")
    with pytest.raises(ValueError, match="lifetime"):
        AgentSandboxKind("k", runs=(), warm_pool="p", lifetime=timedelta(0))
    # Shutdowns are whole seconds: a shorter life could round to a shutdown before the request.
    with pytest.raises(ValueError, match="lifetime"):
        AgentSandboxKind("k", runs=(), warm_pool="p", lifetime=timedelta(milliseconds=999))
    with pytest.raises(ValueError, match="policy"):
        AgentSandboxKind("k", runs=(), warm_pool="p", shutdown_policy="Keep")
