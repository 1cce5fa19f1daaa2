"""Sandbox tokens: signed, scoped, expiring at shutdown, with rotating keys."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from uuid import UUID

import jwt
import pytest

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.tokens import JwtSandboxTokens, SigningKey
from agentruns.domain.errors import InvalidToken, SandboxError
from agentruns.domain.sandbox import AgentSandbox, SandboxState
from tests.strategies import EPOCH

SECRET_A = b"a" * 32
SECRET_B = b"b" * 32
KEY_A = SigningKey("a", SECRET_A, not_after=EPOCH + timedelta(days=30))
SANDBOX = AgentSandbox(
    id=UUID(int=7),
    kind="coder",
    workspace="ws",
    subject="conversation:1",
    state=SandboxState.REQUESTED,
    requested_at=EPOCH,
    shutdown_at=EPOCH + timedelta(hours=1),
    claim_name="sbx-7",
)


def _b64(data: dict[str, object]) -> str:
    raw = json.dumps(data).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _claims(**extra: object) -> dict[str, object]:
    claims: dict[str, object] = {
        "iss": "agentruns",
        "aud": "agentruns-gateway",
        "sub": SANDBOX.subject,
        "sid": str(SANDBOX.id),
        "ws": SANDBOX.workspace,
        "iat": int(EPOCH.timestamp()),
        "exp": int(SANDBOX.shutdown_at.timestamp()),
    }
    claims.update(extra)
    return claims


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(EPOCH)


@pytest.fixture
def tokens(clock: ManualClock) -> JwtSandboxTokens:
    return JwtSandboxTokens([KEY_A], clock)


def test_a_token_names_the_sandbox_its_workspace_and_subject(tokens: JwtSandboxTokens) -> None:
    """Verifying an issued token gives back what it names and its expiry, the shutdown."""
    identity = tokens.verify(tokens.issue(SANDBOX))
    assert identity.sandbox_id == SANDBOX.id
    assert identity.workspace == "ws"
    assert identity.subject == "conversation:1"
    assert identity.expires_at == SANDBOX.shutdown_at


def test_a_token_stops_at_the_sandbox_shutdown(
    tokens: JwtSandboxTokens, clock: ManualClock
) -> None:
    """A token is good until its sandbox's shutdown and refused from then on."""
    token = tokens.issue(SANDBOX)
    clock.advance(timedelta(minutes=59, seconds=59))
    tokens.verify(token)
    clock.advance(timedelta(seconds=1))
    with pytest.raises(InvalidToken):
        tokens.verify(token)


def test_a_token_never_outlives_its_signing_key(clock: ManualClock) -> None:
    """A key that ends before the shutdown caps the token's expiry at the key's end."""
    short = SigningKey("short", SECRET_A, not_after=EPOCH + timedelta(minutes=10))
    tokens = JwtSandboxTokens([short], clock)
    assert tokens.signable_until() == short.not_after
    assert tokens.verify(tokens.issue(SANDBOX)).expires_at == short.not_after


def test_keys_rotate_sign_with_the_newest_verify_with_any_live_key(clock: ManualClock) -> None:
    """A new key signs new tokens; tokens of the older key hold until that key ends."""
    old_token = JwtSandboxTokens([KEY_A], clock).issue(SANDBOX)
    key_b = SigningKey("b", SECRET_B, not_before=EPOCH, not_after=EPOCH + timedelta(days=60))
    rotated = JwtSandboxTokens([KEY_A, key_b], clock)
    new_token = rotated.issue(SANDBOX)
    assert jwt.get_unverified_header(new_token)["kid"] == "b"
    assert rotated.verify(old_token).sandbox_id == SANDBOX.id
    assert rotated.verify(new_token).sandbox_id == SANDBOX.id


def test_a_token_of_an_ended_key_is_refused(clock: ManualClock) -> None:
    """Once its key's life ends, a token signed by it is refused even before its own expiry."""
    key = SigningKey("k", SECRET_A, not_after=EPOCH + timedelta(hours=2))
    later = SigningKey("l", SECRET_B, not_before=EPOCH, not_after=EPOCH + timedelta(days=9))
    tokens = JwtSandboxTokens([key], clock)
    token = tokens.issue(SANDBOX)
    rotated = JwtSandboxTokens([key, later], clock)
    clock.advance(timedelta(hours=2))
    with pytest.raises(InvalidToken):
        rotated.verify(token)


def test_no_live_key_signs_nothing(clock: ManualClock) -> None:
    """With every key ended, issuing fails loudly instead of signing with a dead key."""
    tokens = JwtSandboxTokens([KEY_A], clock)
    clock.advance(timedelta(days=30))
    with pytest.raises(SandboxError):
        tokens.issue(SANDBOX)


def test_a_sandbox_past_its_shutdown_gets_no_token(
    tokens: JwtSandboxTokens, clock: ManualClock
) -> None:
    """A token that would be born expired is not signed."""
    clock.advance(timedelta(hours=1))
    with pytest.raises(SandboxError):
        tokens.issue(SANDBOX)


@pytest.mark.parametrize("token", [None, "", "garbage", "a.b.c", "e30.e30.e30"])
def test_a_missing_or_malformed_token_is_invalid(
    tokens: JwtSandboxTokens, token: str | None
) -> None:
    """Nothing that is not a signed token gets through."""
    with pytest.raises(InvalidToken):
        tokens.verify(token)


def test_a_forged_token_is_invalid(tokens: JwtSandboxTokens) -> None:
    """A token signed under a known key id with another secret fails its signature."""
    forged = jwt.encode(_claims(), SECRET_B, algorithm="HS256", headers={"kid": "a"})
    with pytest.raises(InvalidToken):
        tokens.verify(forged)


def test_a_tampered_token_is_invalid(tokens: JwtSandboxTokens) -> None:
    """Changing the subject of a genuine token breaks its signature."""
    header, _, signature = tokens.issue(SANDBOX).split(".")
    tampered = ".".join([header, _b64(_claims(sub="conversation:2")), signature])
    with pytest.raises(InvalidToken):
        tokens.verify(tampered)


def test_an_unknown_key_id_is_invalid(tokens: JwtSandboxTokens) -> None:
    """A token naming a key the verifier does not know is refused."""
    token = jwt.encode(_claims(), SECRET_A, algorithm="HS256", headers={"kid": "zz"})
    with pytest.raises(InvalidToken):
        tokens.verify(token)


def test_an_unsigned_token_is_invalid(tokens: JwtSandboxTokens) -> None:
    """``alg=none`` is never accepted."""
    unsigned = ".".join([_b64({"alg": "none", "typ": "JWT", "kid": "a"}), _b64(_claims()), ""])
    with pytest.raises(InvalidToken):
        tokens.verify(unsigned)


def test_another_algorithm_is_invalid() -> None:
    """A token signed with the key's secret under another algorithm is refused."""
    long_key = SigningKey("long", b"c" * 64, not_after=EPOCH + timedelta(days=1))
    tokens = JwtSandboxTokens([long_key], ManualClock(EPOCH))
    token = jwt.encode(_claims(), b"c" * 64, algorithm="HS512", headers={"kid": "long"})
    with pytest.raises(InvalidToken):
        tokens.verify(token)


@pytest.mark.parametrize("missing", ["sid", "ws", "sub", "exp", "aud"])
def test_a_token_missing_a_claim_is_invalid(tokens: JwtSandboxTokens, missing: str) -> None:
    """A validly signed token that does not name everything is refused."""
    claims = _claims()
    del claims[missing]
    token = jwt.encode(claims, SECRET_A, algorithm="HS256", headers={"kid": "a"})
    with pytest.raises(InvalidToken):
        tokens.verify(token)


def test_a_token_for_another_audience_is_invalid(tokens: JwtSandboxTokens) -> None:
    """A token signed for something else than the gateway is refused."""
    token = jwt.encode(_claims(aud="other"), SECRET_A, algorithm="HS256", headers={"kid": "a"})
    with pytest.raises(InvalidToken):
        tokens.verify(token)


def test_signing_keys_refuse_short_secrets_and_bad_lives() -> None:
    """Keys are checked when they are built, not when a token fails."""
    with pytest.raises(ValueError, match="32 bytes"):
        SigningKey("k", b"short", not_after=EPOCH)
    with pytest.raises(ValueError, match="end after"):
        SigningKey("k", SECRET_A, not_before=EPOCH, not_after=EPOCH)
    with pytest.raises(ValueError, match="twice"):
        JwtSandboxTokens([KEY_A, KEY_A], ManualClock(EPOCH))


def _signed(**claims: object) -> str:
    return jwt.encode(_claims(**claims), SECRET_A, algorithm="HS256", headers={"kid": "a"})


@pytest.mark.parametrize(
    "exp",
    [10**20, 2**63, 10**400, 253402300800, -1, 1.5, True, "1893456000", None],
    ids=["1e20", "2**63", "1e400", "year-10000", "negative", "float", "bool", "string", "null"],
)
def test_a_signed_token_with_an_unusable_expiry_is_invalid_not_an_error(
    tokens: JwtSandboxTokens, exp: object
) -> None:
    """Even under our own signature, an expiry no datetime holds refuses the token (401)."""
    with pytest.raises(InvalidToken):
        tokens.verify(_signed(exp=exp))


def test_not_before_is_checked_on_the_injected_clock(clock: ManualClock) -> None:
    """``nbf`` is read on the clock agentruns was given, in both directions: a token whose nbf
    the system clock passed long ago is refused while the injected clock is before it, and one
    whose nbf is far in the system clock's future is good once the injected clock reaches it."""
    key = SigningKey("n", SECRET_A, not_after=EPOCH.replace(year=2200))
    tokens = JwtSandboxTokens([key], clock)

    def signed(nbf: int, exp: int) -> str:
        return jwt.encode(
            _claims(nbf=nbf, exp=exp), SECRET_A, algorithm="HS256", headers={"kid": "n"}
        )

    soon = int((EPOCH + timedelta(hours=1)).timestamp())
    early = signed(nbf=soon, exp=soon + 3600)
    with pytest.raises(InvalidToken):
        tokens.verify(early)
    clock.set(EPOCH + timedelta(hours=1))
    assert tokens.verify(early).sandbox_id == SANDBOX.id

    far = int(EPOCH.replace(year=2150).timestamp())
    late = signed(nbf=far, exp=far + 3600)
    with pytest.raises(InvalidToken):
        tokens.verify(late)
    clock.set(EPOCH.replace(year=2150))
    assert tokens.verify(late).sandbox_id == SANDBOX.id


@pytest.mark.parametrize("nbf", [10**20, -5, 1.5, "soon", [1]], ids=str)
def test_an_unusable_not_before_is_invalid_not_an_error(
    tokens: JwtSandboxTokens, nbf: object
) -> None:
    with pytest.raises(InvalidToken):
        tokens.verify(_signed(nbf=nbf))
