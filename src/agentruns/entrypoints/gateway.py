"""The sandbox gateway: the HTTP face a sandbox calls with its token (``gateway`` extra).

Only ``/internal/agent/**`` exists here, and every route there needs a sandbox token
(``Authorization: Bearer <token>``). An ASGI middleware in front of the app checks the token's
signature before anything else, before a byte of the body is read (so an unauthenticated caller
learns nothing about the API and costs no memory), then reads the body up to
:data:`MAX_BODY_BYTES` within ``body_timeout`` (408 for a client that trickles it); then, in the
route's one transaction, the sandbox must be live and before its shutdown (a taken-back sandbox's
token stops at once), and its first call marks it READY.

=========================================  ====================================================
``GET  /internal/agent/sandbox``           the sandbox as the server sees it (a check-in)
``POST /internal/agent/next``              lease the subject's next run: 200 run + fence, or 204
``POST /internal/agent/runs/{id}/renew``   the heartbeat, fenced by ``epoch``
``POST /internal/agent/runs/{id}/end``     settle the run, fenced by ``epoch``
=========================================  ====================================================

Answers: 401 for a missing, malformed, forged, expired or revoked token; 413 for a body over the
limit; 408 for a body not received within ``body_timeout``; 400 for a body that is not JSON; 422
for a body or path that does not validate; 409 when the fence no longer holds; 404 and 405 for
other paths and methods; 503 when the database cannot be reached. Every answer but a success is
``{"detail": <a fixed phrase of its status>}``: no refusal echoes the input or says which check
failed. The one exception is a renew or an end whose fence does not hold: its 409 adds
``"reason"``, ``"lease_lost"`` (taken back, another epoch, or not this sandbox's run),
``"cancelled"`` or ``"ended"`` (the run ended at that epoch), so a sandbox knows whether to
stop its work as cancelled; only a run of the sandbox's own subject says more than
``lease_lost``. Each route is one transaction, so a refused call writes nothing.

:func:`serve` (from :mod:`agentruns.entrypoints.http`) runs the app with uvicorn until the
caller's stop event is set.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route signatures at runtime,
# and the token dependency is a closure over the use cases.
import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Annotated, Literal, Self
from uuid import UUID

from fastapi import APIRouter, FastAPI, Header, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictInt
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentruns.app.approvals import AgentApprovals
from agentruns.app.runs import AgentRuns
from agentruns.app.sandboxes import AgentSandboxes
from agentruns.domain.errors import (
    AgentRunsError,
    IllegalTransition,
    InvalidRequest,
    LeaseLost,
    RunNotFound,
    SandboxError,
    StoreUnavailable,
)
from agentruns.domain.limits import MAX_EPOCH
from agentruns.domain.run import AgentRun
from agentruns.domain.sandbox import AgentSandbox, SandboxLeaseRefused
from agentruns.domain.termination import TerminationReason
from agentruns.entrypoints.http import serve

__all__ = ["MAX_BODY_BYTES", "PREFIX", "create_gateway", "serve"]

PREFIX = "/internal/agent"
# A renewal or an end is a few dozen bytes; nothing a sandbox sends comes near this.
MAX_BODY_BYTES = 64 * 1024
# A sandbox sends its few dozen bytes at once: a client still sending after this holds a
# connection and a task for nothing (AGENTRUNS_GATEWAY_BODY_TIMEOUT).
BODY_TIMEOUT = timedelta(seconds=10)

# The one body of every refusal: its status's phrase, never the input or the failed check.
_PHRASES = {
    400: "bad request",
    401: "unauthorized",
    404: "not found",
    405: "method not allowed",
    408: "request timeout",
    409: "the lease does not hold",
    413: "body too large",
    422: "invalid request",
    503: "unavailable",
}


def _refusal(status: int, *, close: bool = False) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    if close:
        # The rest of the body is not awaited: the connection is not reused.
        headers["Connection"] = "close"
    phrase = _PHRASES.get(status, "refused" if status < 500 else "server error")
    return JSONResponse({"detail": phrase}, status_code=status, headers=headers)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RenewBody(_Body):
    epoch: StrictInt = Field(ge=1, le=MAX_EPOCH)


class EndBody(_Body):
    epoch: StrictInt = Field(ge=1, le=MAX_EPOCH)
    reason: Literal["completed", "failed", "cancelled", "not_retryable"]
    # The run's result (ADRs/0026), written with the end; checked as the library checks it.
    result: JsonValue = None


class FenceOut(BaseModel):
    run_id: UUID
    workspace: str
    epoch: int


class RunOut(BaseModel):
    id: UUID
    kind: str
    workspace: str
    subject: str
    payload: dict[str, JsonValue]
    state: str
    epoch: int
    attempt: int
    leased_until: datetime | None
    deadline_at: datetime | None
    end_reason: str | None
    result: JsonValue = None

    @classmethod
    def of(cls, run: AgentRun) -> Self:
        return cls(
            id=run.id,
            kind=run.kind,
            workspace=run.workspace,
            subject=run.subject,
            payload=run.payload,
            state=run.state.value,
            epoch=run.epoch,
            attempt=run.attempt,
            leased_until=run.leased_until,
            deadline_at=run.deadline_at,
            end_reason=run.end_reason.value if run.end_reason else None,
            result=run.result,
        )


class LeaseOut(BaseModel):
    run: RunOut
    fence: FenceOut


class SandboxOut(BaseModel):
    id: UUID
    kind: str
    workspace: str
    subject: str
    state: str
    shutdown_at: datetime

    @classmethod
    def of(cls, sandbox: AgentSandbox) -> Self:
        return cls(
            id=sandbox.id,
            kind=sandbox.kind,
            workspace=sandbox.workspace,
            subject=sandbox.subject,
            state=sandbox.state.value,
            shutdown_at=sandbox.shutdown_at,
        )


def _bearer(authorization: str | None) -> str | None:
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class _Gate:
    """The gateway's front door, as ASGI middleware, so it runs before FastAPI reads anything.

    On ``/internal/agent/**`` the token's signature is checked first, from the headers alone: an
    unauthenticated call is answered 401 before a byte of its body is read (the server discards
    the rest). Then the body is read up to ``max_body`` bytes, or answered 413 (at once when its
    declared length is over), within ``body_timeout`` seconds (``None``: no bound), or answered
    408, and handed to the app.
    """

    def __init__(
        self,
        app: ASGIApp,
        sandboxes: AgentSandboxes,
        max_body: int,
        body_timeout: float | None = None,
    ) -> None:
        self._app = app
        self._sandboxes = sandboxes
        self._max_body = max_body
        self._body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope["path"]
        if path == PREFIX or path.startswith(PREFIX + "/"):
            try:
                self._sandboxes.identify(_bearer(headers.get("authorization")))
            except (SandboxError, ValueError):
                await _refusal(401)(scope, receive, send)
                return
        declared = headers.get("content-length", "0")
        if not declared.isdigit() or int(declared) > self._max_body:
            await _refusal(413 if declared.isdigit() else 400)(scope, receive, send)
            return
        body = bytearray()
        more = True
        try:
            async with asyncio.timeout(self._body_timeout):
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body += message.get("body", b"")
                    more = message.get("more_body", False)
                    if len(body) > self._max_body:
                        break
        except TimeoutError:
            await _refusal(408, close=True)(scope, receive, send)
            return
        if len(body) > self._max_body:
            await _refusal(413)(scope, receive, send)
            return
        await self._app(scope, _replay(bytes(body), receive), send)


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


def create_gateway(
    sandboxes: AgentSandboxes,
    runs: AgentRuns,
    *,
    max_body: int = MAX_BODY_BYTES,
    body_timeout: timedelta | None = BODY_TIMEOUT,
    approvals: AgentApprovals | None = None,
) -> FastAPI:
    """The gateway app over the host's use cases (serve it on the gateway port only). A body
    not received within ``body_timeout`` is answered 408 (``None`` or zero: no bound).

    With ``approvals`` (``client.approvals``; the pages need the ``console`` extra's Jinja2),
    the gateway also serves signed approval links under ``/approve`` (ADRs/0027): no sandbox
    token there, the link is the credential."""
    seconds = body_timeout.total_seconds() if body_timeout else None
    app = FastAPI(
        title="agentruns sandbox gateway", openapi_url=None, docs_url=None, redoc_url=None
    )
    # The token, already checked by the gate; the route's use case checks it again in its
    # transaction, with the sandbox's liveness.
    Token = Annotated[str | None, Header(alias="authorization", include_in_schema=True)]
    router = APIRouter(prefix=PREFIX)

    @router.get("/sandbox")
    async def sandbox(authorization: Token = None) -> SandboxOut:
        return SandboxOut.of(await sandboxes.call(_bearer(authorization)))

    @router.post("/next", response_model=None)
    async def next_run(authorization: Token = None) -> LeaseOut | Response:
        run = await sandboxes.next_run(_bearer(authorization), runs)
        if run is None:
            return Response(status_code=204)
        fence = run.fence
        return LeaseOut(
            run=RunOut.of(run),
            fence=FenceOut(run_id=fence.run_id, workspace=fence.workspace, epoch=fence.epoch),
        )

    @router.post("/runs/{run_id}/renew")
    async def renew(run_id: UUID, body: RenewBody, authorization: Token = None) -> RunOut:
        token = _bearer(authorization)
        return RunOut.of(await sandboxes.renew(token, run_id, body.epoch, runs))

    @router.post("/runs/{run_id}/end")
    async def end(run_id: UUID, body: EndBody, authorization: Token = None) -> RunOut:
        reason = TerminationReason(body.reason)
        token = _bearer(authorization)
        ended = await sandboxes.end(token, run_id, body.epoch, reason, runs, result=body.result)
        return RunOut.of(ended)

    app.include_router(router)
    if approvals is not None:
        from agentruns.entrypoints.console.approve import approvals_app

        app.mount("/approve", approvals_app(approvals))

    def answer(status: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def handler(request: Request, exc: Exception) -> JSONResponse:
            return _refusal(status)

        return handler

    async def lease_refused(request: Request, exc: Exception) -> JSONResponse:
        refusal = _refusal(409)
        if isinstance(exc, SandboxLeaseRefused):
            refusal = JSONResponse(
                {"detail": _PHRASES[409], "reason": exc.reason.value}, status_code=409
            )
        return refusal

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        return _refusal(status)

    # Most specific first in meaning; Starlette picks the handler of the nearest class.
    app.add_exception_handler(SandboxError, answer(401))  # InvalidToken, SandboxNotLive
    for lost in (LeaseLost, RunNotFound, IllegalTransition):
        app.add_exception_handler(lost, answer(409))
    app.add_exception_handler(SandboxLeaseRefused, lease_refused)
    app.add_exception_handler(InvalidRequest, answer(422))
    app.add_exception_handler(RequestValidationError, answer(422))
    app.add_exception_handler(StoreUnavailable, answer(503))
    app.add_exception_handler(AgentRunsError, answer(500))
    app.add_exception_handler(HTTPException, http_error)
    app.add_middleware(_Gate, sandboxes=sandboxes, max_body=max_body, body_timeout=seconds)
    return app
