"""Sandbox tokens and approval links as signed JWTs (HS256) with rotating keys.

Both are signed with the same keys for different audiences (``agentruns-gateway``,
``agentruns-approval``), so neither is ever taken for the other (ADRs/0027). An approval link
names its run (``sub``), the signal its wait asks for (``sig``) and the link's id (``lid``).

A token names its sandbox (``sid``), workspace (``ws``) and subject (``sub``) and expires
(``exp``) at the sandbox's shutdown, never after the end of life (``not_after``) of the key that
signed it. Each key has an id (``kid`` in the token's header) so keys rotate: tokens are signed
with the newest usable key and verified with whichever known key signed them, while that key is
still alive. Only HS256 is accepted, whatever the header claims (so never ``alg=none``).

Every time claim (``exp``, and ``nbf`` when a token carries one) is checked against the injected
:class:`~agentruns.app.ports.Clock`, never PyJWT's own reading of the system clock, so tests move
time by hand; a time that is not a whole number of seconds within the years 1970 to 9999 makes the
token invalid, not the gateway fail.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import jwt

from agentruns.app.approval_ports import ApprovalLink, ApprovalTokens
from agentruns.app.ports import Clock
from agentruns.app.sandbox_ports import SandboxIdentity, SandboxTokens
from agentruns.domain.errors import InvalidRequest, InvalidToken, SandboxError
from agentruns.domain.sandbox import AgentSandbox

ALGORITHM = "HS256"
ISSUER = "agentruns"
AUDIENCE = "agentruns-gateway"
# An approval link is signed with the same keys for another audience: a sandbox's token is never
# an approval link, and an approval link never a sandbox's token (ADRs/0027).
APPROVAL_AUDIENCE = "agentruns-approval"
MIN_SECRET_BYTES = 32
_REQUIRED = ["exp", "iat", "iss", "aud", "sub", "sid", "ws"]
_APPROVAL_REQUIRED = ["exp", "iat", "iss", "aud", "sub", "sig", "lid"]
# The latest time a claim may name: 9999-12-31T23:59:59Z, the last second a datetime holds.
_LATEST = 253402300799


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A secret under an id, usable until ``not_after``. ``not_before`` orders keys: the newest
    live key signs."""

    kid: str
    secret: bytes = field(repr=False)
    not_after: datetime
    not_before: datetime = datetime(1970, 1, 1, tzinfo=UTC)

    def __post_init__(self) -> None:
        if not self.kid:
            raise ValueError("a signing key needs an id")
        if len(self.secret) < MIN_SECRET_BYTES:
            raise ValueError(f"an HS256 secret needs at least {MIN_SECRET_BYTES} bytes")
        if self.not_after.tzinfo is None or self.not_before.tzinfo is None:
            raise ValueError("a signing key's life needs aware datetimes")
        if self.not_after <= self.not_before:
            raise ValueError("a signing key must end after it starts")

    def alive(self, now: datetime) -> bool:
        return self.not_before <= now < self.not_after


class JwtSandboxTokens(SandboxTokens):
    """Signs with the newest live key; verifies with any known live key."""

    def __init__(self, keys: Iterable[SigningKey], clock: Clock) -> None:
        self._keys = _keyring(keys, "sandbox tokens")
        self._clock = clock

    def _signing_key(self) -> SigningKey:
        key = _newest_live(self._keys, self._clock.now())
        if key is None:
            raise SandboxError("no signing key is alive: add a new key before the last one ends")
        return key

    def signable_until(self) -> datetime:
        return self._signing_key().not_after

    def issue(self, sandbox: AgentSandbox) -> str:
        key = self._signing_key()
        now = self._clock.now()
        expires_at = min(sandbox.shutdown_at, key.not_after)
        if expires_at <= now:
            raise SandboxError(f"sandbox {sandbox.id} is past its shutdown: no token to sign")
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": sandbox.subject,
            "sid": str(sandbox.id),
            "ws": sandbox.workspace,
            "iat": int(now.timestamp()),
            # JWT times are whole seconds: round down, so a token never outlives its sandbox.
            "exp": int(expires_at.timestamp()),
        }
        return jwt.encode(claims, key.secret, algorithm=ALGORITHM, headers={"kid": key.kid})

    def verify(self, token: str | None) -> SandboxIdentity:
        now = self._clock.now()
        return _identity(_decode(self._keys, now, token, AUDIENCE, _REQUIRED), now)


class JwtApprovalTokens(ApprovalTokens):
    """Approval links as HS256 JWTs over the gateway's keys, for their own audience: the run
    (``sub``), the signal's name (``sig``), the link's id (``lid``) and its end (``exp``)."""

    def __init__(self, keys: Iterable[SigningKey], clock: Clock) -> None:
        self._keys = _keyring(keys, "approval links")
        self._clock = clock

    def _signing_key(self) -> SigningKey:
        key = _newest_live(self._keys, self._clock.now())
        if key is None:
            raise InvalidRequest("no signing key is alive: no approval link can be signed")
        return key

    def signable_until(self) -> datetime:
        return self._signing_key().not_after

    def issue(self, link: ApprovalLink) -> str:
        key = self._signing_key()
        now = self._clock.now()
        expires_at = min(link.expires_at, key.not_after)
        if expires_at <= now:
            raise InvalidRequest("an approval link must end after now")
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "aud": APPROVAL_AUDIENCE,
            "sub": str(link.run_id),
            "sig": link.name,
            "lid": link.link_id,
            "iat": int(now.timestamp()),
            # Whole seconds, rounded down: a link never outlives its wait.
            "exp": int(expires_at.timestamp()),
        }
        return jwt.encode(claims, key.secret, algorithm=ALGORITHM, headers={"kid": key.kid})

    def verify(self, token: str | None) -> ApprovalLink:
        now = self._clock.now()
        claims = _decode(self._keys, now, token, APPROVAL_AUDIENCE, _APPROVAL_REQUIRED)
        run, name, link_id = claims["sub"], claims["sig"], claims["lid"]
        if not all(isinstance(v, str) and v for v in (run, name, link_id)):
            raise InvalidToken("bad token")
        expires_at = _in_time(claims, now)
        try:
            run_id = UUID(run)
        except ValueError as exc:
            raise InvalidToken("bad token") from exc
        return ApprovalLink(run_id, name, link_id, expires_at)


def _keyring(keys: Iterable[SigningKey], what: str) -> dict[str, SigningKey]:
    """The keys by id; each id once, and at least one key."""
    ring: dict[str, SigningKey] = {}
    for key in keys:
        if key.kid in ring:
            raise ValueError(f"signing key {key.kid!r} is given twice")
        ring[key.kid] = key
    if not ring:
        raise ValueError(f"{what} need at least one signing key")
    return ring


def _newest_live(keys: dict[str, SigningKey], now: datetime) -> SigningKey | None:
    """The key that signs at ``now``: the newest live one (``None``: none is alive)."""
    live = [key for key in keys.values() if key.alive(now)]
    return max(live, key=lambda key: (key.not_before, key.not_after)) if live else None


def _in_time(claims: dict[str, Any], now: datetime) -> datetime:
    """The token's end, once its times hold at ``now`` on the injected clock."""
    expires_at = _seconds(claims["exp"])
    if expires_at <= now:
        raise InvalidToken("expired token")
    if "nbf" in claims and _seconds(claims["nbf"]) > now:
        raise InvalidToken("token not valid yet")
    return expires_at


def _decode(
    keys: dict[str, SigningKey],
    now: datetime,
    token: str | None,
    audience: str,
    required: list[str],
) -> dict[str, Any]:
    """The claims of ``token`` once its header, key, signature, issuer and audience hold (its
    times are the caller's to check, on the injected clock); else InvalidToken."""
    if not token:
        raise InvalidToken("no token")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise InvalidToken("malformed token") from exc
    if header.get("alg") != ALGORITHM:
        raise InvalidToken("wrong algorithm")
    kid = header.get("kid")
    key = keys.get(kid) if isinstance(kid, str) else None
    if key is None:
        raise InvalidToken("unknown key")
    if not key.alive(now):
        raise InvalidToken("expired key")
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key.secret,
            algorithms=[ALGORITHM],
            audience=audience,
            issuer=ISSUER,
            # Times are checked by the caller on the injected clock; the signature is checked here.
            options={
                "require": required,
                "verify_exp": False,
                "verify_iat": False,
                "verify_nbf": False,
            },
        )
    except jwt.PyJWTError as exc:
        raise InvalidToken("bad token") from exc
    return claims


def _seconds(value: object) -> datetime:
    """A JWT time (whole seconds since 1970) as a datetime; anything else is a bad token."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _LATEST:
        raise InvalidToken("bad token")
    return datetime.fromtimestamp(value, UTC)


def _identity(claims: dict[str, Any], now: datetime) -> SandboxIdentity:
    sid, workspace, subject = claims["sid"], claims["ws"], claims["sub"]
    if not all(isinstance(v, str) for v in (sid, workspace, subject)):
        raise InvalidToken("bad token")
    expires_at = _in_time(claims, now)
    try:
        sandbox_id = UUID(sid)
    except ValueError as exc:
        raise InvalidToken("bad token") from exc
    return SandboxIdentity(sandbox_id, workspace, subject, expires_at)
