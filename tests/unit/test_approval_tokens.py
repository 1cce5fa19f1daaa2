"""Approval links' tokens: signed with the gateway's keys for their own audience, expiring."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from uuid import UUID

import jwt
import pytest

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.tokens import JwtApprovalTokens, JwtSandboxTokens, SigningKey
from agentruns.app.approval_ports import ApprovalLink
from agentruns.domain.errors import InvalidRequest, InvalidToken
from agentruns.domain.sandbox import AgentSandbox, SandboxState
from tests.strategies import EPOCH

KEY_A = SigningKey("a", b"a" * 32, not_after=EPOCH + timedelta(days=30))
KEY_B = SigningKey(
    "b", b"b" * 32, not_before=EPOCH + timedelta(days=1), not_after=EPOCH + timedelta(days=60)
)
LINK = ApprovalLink(UUID(int=9), "approval", "abc123", EPOCH + timedelta(hours=2))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(EPOCH)


@pytest.fixture
def tokens(clock: ManualClock) -> JwtApprovalTokens:
    return JwtApprovalTokens([KEY_A], clock)


def _b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def test_a_link_round_trips(tokens: JwtApprovalTokens) -> None:
    """What is signed is what is read back, and its signal id is the link's."""
    assert tokens.verify(tokens.issue(LINK)) == LINK
    assert LINK.signal_id == "link:abc123"


def test_a_forged_signature_is_refused(tokens: JwtApprovalTokens) -> None:
    """A token signed with another secret under a known key id is refused."""
    claims = {
        "iss": "agentruns",
        "aud": "agentruns-approval",
        "sub": str(LINK.run_id),
        "sig": "approval",
        "lid": "x",
        "iat": int(EPOCH.timestamp()),
        "exp": int(LINK.expires_at.timestamp()),
    }
    forged = jwt.encode(claims, b"z" * 32, algorithm="HS256", headers={"kid": "a"})
    with pytest.raises(InvalidToken):
        tokens.verify(forged)


def test_a_sandbox_token_is_no_link_and_a_link_no_sandbox_token(
    tokens: JwtApprovalTokens, clock: ManualClock
) -> None:
    """The two audiences keep the gateway's tokens and the links apart, over the same keys."""
    sandbox_tokens = JwtSandboxTokens([KEY_A], clock)
    sandbox = AgentSandbox(
        id=UUID(int=7),
        kind="coder",
        workspace="ws",
        subject="s",
        state=SandboxState.REQUESTED,
        requested_at=EPOCH,
        shutdown_at=EPOCH + timedelta(hours=1),
        claim_name="sbx-7",
    )
    with pytest.raises(InvalidToken):
        tokens.verify(sandbox_tokens.issue(sandbox))
    with pytest.raises(InvalidToken):
        sandbox_tokens.verify(tokens.issue(LINK))


def test_an_expired_link_is_refused(tokens: JwtApprovalTokens, clock: ManualClock) -> None:
    """At its end, on the injected clock, a link is no longer valid."""
    token = tokens.issue(LINK)
    clock.advance(timedelta(hours=2))
    with pytest.raises(InvalidToken, match="expired"):
        tokens.verify(token)


def test_alg_none_and_malformed_tokens_are_refused(tokens: JwtApprovalTokens) -> None:
    """An unsigned token, garbage and nothing are refused, never an error of another kind."""
    header = _b64({"alg": "none", "typ": "JWT", "kid": "a"})
    body = _b64({"sub": str(LINK.run_id), "aud": "agentruns-approval"})
    for bad in (f"{header}.{body}.", "not-a-token", "a.b.c", "", None):
        with pytest.raises(InvalidToken):
            tokens.verify(bad)


def test_keys_rotate(clock: ManualClock) -> None:
    """The newest live key signs; a link signed by the older key verifies while that key lives."""
    tokens = JwtApprovalTokens([KEY_A, KEY_B], clock)
    old = tokens.issue(LINK)
    assert jwt.get_unverified_header(old)["kid"] == "a"
    clock.advance(timedelta(days=1))
    later = ApprovalLink(LINK.run_id, "approval", "n", EPOCH + timedelta(days=2))
    assert jwt.get_unverified_header(tokens.issue(later))["kid"] == "b"
    assert JwtApprovalTokens([KEY_B], clock).verify(tokens.issue(later)) == later
    with pytest.raises(InvalidToken):
        JwtApprovalTokens([KEY_B], clock).verify(old)  # a key not known is not trusted


def test_a_link_never_outlives_its_key(tokens: JwtApprovalTokens) -> None:
    """A link asked to end after the key's end of life ends with the key; one ended is refused."""
    far = ApprovalLink(LINK.run_id, "approval", "f", EPOCH + timedelta(days=90))
    assert tokens.verify(tokens.issue(far)).expires_at == KEY_A.not_after
    with pytest.raises(InvalidRequest):
        tokens.issue(ApprovalLink(LINK.run_id, "approval", "p", EPOCH))
