"""The sandbox gateway: the HTTP face a sandbox calls with its token (``gateway`` extra).

Only ``/internal/agent/**`` exists here, and every route there needs a sandbox token
(``Authorization: Bearer <token>``). The token's signature is checked before anything else, even
before the body is read, so an unauthenticated caller learns nothing about the API; then, in the
route's one transaction, the sandbox must be live and before its shutdown (a taken-back sandbox's
token stops at once), and its first call marks it READY.

=========================================  ====================================================
``GET  /internal/agent/sandbox``           the sandbox as the server sees it (a check-in)
``POST /internal/agent/next``              lease the subject's next run: 200 run + fence, or 204
``POST /internal/agent/runs/{id}/renew``   the heartbeat, fenced by ``epoch``
``POST /internal/agent/runs/{id}/end``     settle the run, fenced by ``epoch``
=========================================  ====================================================

Answers: 401 with no detail for a missing, malformed, forged, expired or revoked token; 422 for a
body that does not validate; 409 when the fence no longer holds. Each route is one transaction,
so a refused call writes nothing.

:func:`serve` runs the app with uvicorn until the caller's stop event is set.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route signatures at runtime,
# and the token dependency is a closure over the use cases.
import asyncio
import math
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Annotated, Literal, Self
from uuid import UUID

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Header, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictInt

from agentruns.app.runs import AgentRuns
from agentruns.app.sandboxes import AgentSandboxes
from agentruns.domain.errors import (
    IllegalTransition,
    InvalidRequest,
    InvalidToken,
    LeaseLost,
    RunNotFound,
    SandboxNotLive,
)
from agentruns.domain.run import AgentRun
from agentruns.domain.sandbox import AgentSandbox
from agentruns.domain.termination import TerminationReason

PREFIX = "/internal/agent"
_UNAUTHORIZED = {"detail": "unauthorized"}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RenewBody(_Body):
    epoch: StrictInt = Field(ge=1)


class EndBody(_Body):
    epoch: StrictInt = Field(ge=1)
    reason: Literal["completed", "failed", "cancelled", "not_retryable"]


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


def create_gateway(sandboxes: AgentSandboxes, runs: AgentRuns) -> FastAPI:
    """The gateway app over the host's use cases (serve it on the gateway port only)."""
    app = FastAPI(
        title="agentruns sandbox gateway", openapi_url=None, docs_url=None, redoc_url=None
    )

    def sandbox_token(authorization: Annotated[str | None, Header()] = None) -> str:
        token = _bearer(authorization)
        sandboxes.identify(token)  # the signature, before the body is even read
        return token or ""

    Token = Annotated[str, Depends(sandbox_token)]
    router = APIRouter(prefix=PREFIX)

    @router.get("/sandbox")
    async def sandbox(token: Token) -> SandboxOut:
        return SandboxOut.of(await sandboxes.call(token))

    @router.post("/next", response_model=None)
    async def next_run(token: Token) -> LeaseOut | Response:
        run = await sandboxes.next_run(token, runs)
        if run is None:
            return Response(status_code=204)
        fence = run.fence
        return LeaseOut(
            run=RunOut.of(run),
            fence=FenceOut(run_id=fence.run_id, workspace=fence.workspace, epoch=fence.epoch),
        )

    @router.post("/runs/{run_id}/renew")
    async def renew(run_id: UUID, body: RenewBody, token: Token) -> RunOut:
        return RunOut.of(await sandboxes.renew(token, run_id, body.epoch, runs))

    @router.post("/runs/{run_id}/end")
    async def end(run_id: UUID, body: EndBody, token: Token) -> RunOut:
        reason = TerminationReason(body.reason)
        return RunOut.of(await sandboxes.end(token, run_id, body.epoch, reason, runs))

    app.include_router(router)

    async def unauthorized(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(_UNAUTHORIZED, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    async def conflict(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": "the lease does not hold"}, status_code=409)

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    for refused in (InvalidToken, SandboxNotLive):
        app.add_exception_handler(refused, unauthorized)
    for lost in (LeaseLost, RunNotFound, IllegalTransition):
        app.add_exception_handler(lost, conflict)
    app.add_exception_handler(InvalidRequest, invalid)
    return app


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the caller's stop event ends it, and the
    process's handlers (the command's) stay in place."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listening now, so a call that comes before uvicorn accepts waits instead of failing.
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


async def serve(
    app: FastAPI,
    host: str,
    port: int,
    stop: asyncio.Event,
    *,
    started: Callable[[str], None],
    grace: float | None = None,
) -> None:
    """Serve ``app`` on ``host:port`` until ``stop`` is set, then stop accepting and give calls in
    flight ``grace`` seconds. The port is bound first (``OSError`` if it cannot be, ``0`` picks a
    free one), then ``started`` gets the URL."""
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        lifespan="off",
        ws="none",
        log_config=None,
        access_log=False,
        # Whole seconds, rounded up: uvicorn's 0 cancels calls in flight at once.
        timeout_graceful_shutdown=math.ceil(grace) if grace is not None else None,
    )
    server = _Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    stopping = asyncio.create_task(stop.wait())
    shown = f"[{host}]" if ":" in host else host
    started(f"http://{shown}:{bound_port}")
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        server.should_exit = True
        stopping.cancel()
        with suppress(asyncio.CancelledError):
            await stopping
        try:
            await serving
        finally:
            sock.close()
