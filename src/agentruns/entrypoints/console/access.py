"""Who may see the console, and proof that a POST came from its own page.

:class:`ConsoleAccess` is the credential an operator configures (a bearer token, or a user and
password for HTTP basic auth). :class:`Gate`, an ASGI middleware in front of every route,
answers 401 before a route runs or a byte of a body is read, unless the request carries the
credential: an ``Authorization`` header, or the session cookie the login page sets for a browser
given the token. Only the login page and the static files (which hold no data) are served
without it. Bodies are read up to :data:`MAX_BODY_BYTES`.

CSRF: every action is a POST whose form carries the value of the console's CSRF cookie (set,
``SameSite=Strict`` and ``HttpOnly``, by the page that shows the form); a POST whose field does
not match the cookie, or whose ``Origin`` names another host, is refused with 403.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import html
import ipaddress
import secrets
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 16 * 1024
CSRF_COOKIE = "agentruns_csrf"
SESSION_COOKIE = "agentruns_session"
# Paths (under the console's root) served to anyone: the login page and the static files.
_OPEN = ("/login", "/static/")


@dataclass(frozen=True, slots=True)
class ConsoleAccess:
    """The credential the console asks for: a bearer ``token`` (``Authorization: Bearer ...``,
    or typed once into the login page by a browser), and/or a ``user`` and ``password`` for
    HTTP basic auth. At least one must be given; text of at least 8 characters."""

    token: str | None = None
    user: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if self.token is None and self.user is None and self.password is None:
            raise ValueError("console access needs a token, or a user and a password")
        if (self.user is None) != (self.password is None):
            raise ValueError("console basic auth needs both a user and a password")
        if self.token is not None and len(self.token) < 8:
            raise ValueError("a console token has at least 8 characters")
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


def new_csrf_token() -> str:
    return secrets.token_urlsafe(24)


def csrf_holds(cookie: str | None, field: str | None) -> bool:
    return bool(cookie) and bool(field) and _same(cookie or "", field or "")


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

    def __init__(self, app: ASGIApp, access: ConsoleAccess | None, max_body: int) -> None:
        self._app = app
        self._access = access
        self._max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        own = path[len(root) :] if root and path.startswith(root) else path
        access = self._access
        if (
            access is not None
            and not own.startswith(_OPEN)
            and not access.admits(headers, _cookies(headers))
        ):
            await _unauthorized(access, root, headers)(scope, receive, send)
            return
        declared = headers.get("content-length", "0")
        if not declared.isdigit() or int(declared) > self._max_body:
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
            if len(body) > self._max_body:
                await PlainTextResponse(_PHRASE[413], status_code=413)(scope, receive, send)
                return
        await self._app(scope, _replay(bytes(body), receive), send)


_PHRASE = {400: "bad request\n", 413: "request body too large\n"}


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
