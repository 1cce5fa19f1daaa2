"""Who may see the console, and proof that a POST came from its own page.

:class:`ConsoleAccess` is the credential an operator configures (a bearer token, or a user and
password for HTTP basic auth). :class:`Gate`, an ASGI middleware in front of every route,
answers 401 before a route runs or a byte of a body is read, unless the request carries the
credential: an ``Authorization`` header, or the session cookie the login page sets for a browser
given the token. Only the login page and the static files (which hold no data) are served
without it. Bodies are read up to :data:`MAX_BODY_BYTES`.

A console without a credential answers only to the loopback names (``localhost``, ``127.0.0.1``,
``[::1]``) and the names it is given (``hosts``): any other ``Host`` is answered 421 with one
line, so a page of another site whose name is rebound to this machine's address (DNS rebinding)
reads nothing and acts on nothing.

CSRF: every action is a POST whose form carries the value of the console's CSRF cookie (set,
``SameSite=Strict`` and ``HttpOnly``, by the page that shows the form); the value is a nonce
signed with the console's secret for the session it was given to (:class:`CsrfSigner`), so a
pair of equal values planted by a client fails. A POST whose field does not match the cookie,
whose signature does not hold, or whose ``Origin`` names another host, is refused with 403.

Login: :class:`LoginThrottle` refuses, with 429, a client address that failed too often lately,
remembering a bounded number of addresses.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import html
import ipaddress
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 16 * 1024
# A token is a bearer secret sent by machines: 16 characters of a random URL-safe text are at
# least 96 bits; `secrets.token_urlsafe(32)` (43 characters, 256 bits) is what the docs give.
MIN_TOKEN_CHARS = 16
CSRF_COOKIE = "agentruns_csrf"
SESSION_COOKIE = "agentruns_session"
# Paths under the console's root served to anyone.
# Open without the credential: the login itself, static files, and the approval pages, whose
# signed link is their credential (ADRs/0027).
_APPROVE = "/approve/"
_OPEN = ("/login", "/static/", _APPROVE)
# An approval's form may carry a comment of 4,000 characters of any script, percent-encoded
# (up to 36 KB): its pages take up to this, and check the comment themselves.
APPROVE_MAX_BODY = 64 * 1024


@dataclass(frozen=True, slots=True)
class ConsoleAccess:
    """The credential the console asks for: a bearer ``token`` (``Authorization: Bearer ...``,
    or typed once into the login page by a browser), and/or a ``user`` and ``password`` for
    HTTP basic auth. At least one must be given. A token has at least
    :data:`MIN_TOKEN_CHARS` characters (generate one with ``python -c "import secrets;
    print(secrets.token_urlsafe(32))"``: 256 bits); a password at least 8."""

    token: str | None = None
    user: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if self.token is None and self.user is None and self.password is None:
            raise ValueError("console access needs a token, or a user and a password")
        if (self.user is None) != (self.password is None):
            raise ValueError("console basic auth needs both a user and a password")
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"a console token has at least {MIN_TOKEN_CHARS} characters (make one with "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        if self.password is not None and len(self.password) < 8:
            raise ValueError("a console password has at least 8 characters")
        if self.user is not None and (not self.user or ":" in self.user):
            raise ValueError("a console user is a name without ':'")

    @property
    def basic(self) -> bool:
        return self.user is not None

    def session(self) -> str | None:
        """The session cookie's value for a browser that gave the token (not the token)."""
        if self.token is None:
            return None
        return hmac.new(
            self.token.encode(), b"agentruns console session", hashlib.sha256
        ).hexdigest()

    def secret(self) -> bytes:
        """A key derived from the credential, the same in every replica that has it (signs the
        CSRF tokens)."""
        material = (self.token or "") + "\0" + (self.user or "") + "\0" + (self.password or "")
        return hmac.new(material.encode(), b"agentruns console csrf", hashlib.sha256).digest()

    def admits_token(self, given: str) -> bool:
        """Whether ``given`` is the token (the login page's check)."""
        return self.token is not None and _same(given, self.token)

    def admits(self, headers: Headers, cookies: dict[str, str]) -> bool:
        """Whether the request carries the credential."""
        scheme, _, value = headers.get("authorization", "").partition(" ")
        value = value.strip()
        if self.token is not None:
            if scheme.lower() == "bearer" and _same(value, self.token):
                return True
            session = self.session()
            if session is not None and _same(cookies.get(SESSION_COOKIE, ""), session):
                return True
        if self.user is not None and self.password is not None and scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError, ValueError):
                return False
            user, _, password = decoded.partition(":")
            # Both compared, always: the time taken does not say which was wrong.
            return _same(user, self.user) & _same(password, self.password)
        return False


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def is_local(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (a loopback address or ``localhost``)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(header: str) -> str:
    """The name of a ``Host`` header, lower case, without its port or brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def host_allowed(header: str, hosts: Collection[str]) -> bool:
    """Whether a console without a credential answers a request sent to ``Host: header``: a
    loopback name or address, or one of ``hosts`` (``"*"``: any)."""
    if "*" in hosts:
        return True
    name = host_name(header).rstrip(".")
    if name in LOOPBACK_NAMES or name in hosts:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class CsrfSigner:
    """CSRF tokens bound to a server-side secret and to the session they were issued to.

    A token is ``nonce.signature``, the signature an HMAC of the nonce and the session (the
    request's credential: its session cookie or ``Authorization`` header) under ``secret``. The
    secret is derived from the credential when there is one (so replicas agree without sharing
    anything), else random for this process. A client that picks an equal cookie and field, or
    replays another session's token, fails :meth:`holds`."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def _sign(self, nonce: str, session: str) -> str:
        message = f"{nonce}|{session}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]

    def issue(self, session: str) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign(nonce, session)}"

    def valid(self, token: str, session: str) -> bool:
        nonce, dot, signature = token.partition(".")
        if not dot or not nonce or len(token) > 128:
            return False
        return _same(signature, self._sign(nonce, session))

    def holds(self, cookie: str | None, field: str | None, session: str) -> bool:
        """A POST's proof: the field equals the cookie and is signed for this session."""
        return (
            bool(cookie)
            and bool(field)
            and _same(cookie or "", field or "")
            and self.valid(field or "", session)
        )


def session_of(headers: Headers, cookies: dict[str, str]) -> str:
    """What a CSRF token is bound to: the request's credential, hashed (empty without one)."""
    given = headers.get("authorization", "") + "\0" + cookies.get(SESSION_COOKIE, "")
    return hashlib.sha256(given.encode()).hexdigest()


class LoginThrottle:
    """Slows down guessing at ``/login``: after ``free`` failures from one client address, each
    further attempt from it is refused until ``2 ** (failures - free)`` seconds (at most
    ``longest``) have passed since its last failure. A success forgets the address; at most
    ``remembered`` addresses are kept (the least recently failed forgotten first), so a flood of
    addresses costs bounded memory."""

    def __init__(
        self,
        *,
        free: int = 5,
        longest: float = 300.0,
        remembered: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._free = free
        self._longest = longest
        self._remembered = remembered
        self._clock = clock
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def wait(self, address: str) -> float:
        """Seconds ``address`` must wait before its next attempt (0: it may try now)."""
        failed = self._failures.get(address)
        if failed is None or failed[0] < self._free:
            return 0.0
        count, last = failed
        delay = min(self._longest, 2.0 ** (count - self._free))
        return max(0.0, last + delay - self._clock())

    def failed(self, address: str) -> None:
        count, _ = self._failures.pop(address, (0, 0.0))
        self._failures[address] = (count + 1, self._clock())
        while len(self._failures) > self._remembered:
            self._failures.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)

    def __len__(self) -> int:
        return len(self._failures)


def origin_holds(headers: Headers) -> bool:
    """A POST from a page of this console: no ``Origin`` (an old client) or one naming the
    host the request was sent to."""
    origin = headers.get("origin")
    if origin is None:
        return True
    host = headers.get("host", "")
    return origin.partition("://")[2].rstrip("/") == host


class Gate:
    """The console's front door (ASGI middleware): the credential first, then the body size."""

    def __init__(
        self,
        app: ASGIApp,
        access: ConsoleAccess | None,
        max_body: int,
        hosts: Collection[str] = (),
    ) -> None:
        self._app = app
        self._access = access
        self._max_body = max_body
        self._hosts = frozenset(host.lower().rstrip(".") for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        own = path[len(root) :] if root and path.startswith(root) else path
        access = self._access
        if access is None and not host_allowed(headers.get("host", ""), self._hosts):
            # Not a name of this machine: a rebound name, or a name to allow (`hosts`).
            await PlainTextResponse(_PHRASE[421], status_code=421)(scope, receive, send)
            return
        if (
            access is not None
            and not own.startswith(_OPEN)
            and not access.admits(headers, _cookies(headers))
        ):
            await _unauthorized(access, root, headers)(scope, receive, send)
            return
        limit = (
            max(self._max_body, APPROVE_MAX_BODY) if own.startswith(_APPROVE) else self._max_body
        )
        declared = headers.get("content-length", "0")
        if not declared.isdigit() or int(declared) > limit:
            status = 413 if declared.isdigit() else 400
            await PlainTextResponse(_PHRASE[status], status_code=status)(scope, receive, send)
            return
        body = bytearray()
        more = scope["method"] not in ("GET", "HEAD")
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                await PlainTextResponse(_PHRASE[413], status_code=413)(scope, receive, send)
                return
        await self._app(scope, _replay(bytes(body), receive), send)


_PHRASE = {
    400: "bad request\n",
    413: "request body too large\n",
    421: "misdirected request: this console answers to its own host names only\n",
}


def _cookies(headers: Headers) -> dict[str, str]:
    found: dict[str, str] = {}
    for part in headers.get("cookie", "").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep:
            found.setdefault(name, value)
    return found


def _unauthorized(access: ConsoleAccess, root: str, headers: Headers) -> Response:
    """401, with nothing of the console's data: a basic-auth challenge, and for a browser a
    link to the login page (when a token is configured)."""
    challenge = {"WWW-Authenticate": 'Basic realm="agentruns console"'} if access.basic else {}
    if "text/html" in headers.get("accept", "") and access.token is not None:
        page = (
            "<!doctype html><meta charset=utf-8><title>agentruns console</title>"
            "<p>Sign in to the agentruns console: "
            f'<a href="{html.escape(root)}/login">log in</a></p>'
        )
        return HTMLResponse(page, status_code=401, headers=challenge)
    return PlainTextResponse("authentication required\n", status_code=401, headers=challenge)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read already, then whatever the server sends next (a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
