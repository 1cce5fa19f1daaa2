"""A run's live stream over HTTP: Server-Sent Events from :meth:`AgentRuns.watch` (ADRs/0030).

Each event of the run is one message whose ``id:`` is the event's number, so a browser's
``EventSource`` that reconnects sends ``Last-Event-ID`` and resumes after the last event it got:
nothing lost, nothing repeated. A state change is a ``state`` message without an id (it moves no
resume point); the run's end is an ``end`` message, and the stream closes. ::

    event: state                      (the run as it is when the stream opens)
    data: {"id": "...", "state": "leased", "epoch": 1, ...}

    id: 3
    event: step
    data: {"seq": 3, "epoch": 1, "type": "step", "data": {...}, "created_at": "..."}

    event: end
    data: {"id": "...", "state": "ended", "end_reason": "completed", "result": ..., ...}

The resume point is ``Last-Event-ID`` if the request has one, else ``?after=``, else 0. A
resume point that is not an event number of the run is answered 400, an unknown run 404, a
refused request 403, an unreachable database 503: a stream never starts with a 500. An idle
stream sends a comment line (``: keep-alive``) every 15 seconds. If the
database fails once the stream has started, an ``error`` message says so and the stream closes;
the browser reconnects and resumes.

The console serves this at ``/runs/<id>/events/stream`` behind its own access gate;
:func:`create_run_stream` is the same stream as an ASGI app a host mounts in its own API.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection
from typing import TYPE_CHECKING
from uuid import UUID

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from agentruns.app.runs import AgentRuns
from agentruns.app.watch import RunUpdate, after_seq
from agentruns.domain.errors import (
    AgentRunsError,
    DatabaseTimeout,
    InvalidRequest,
    RunNotFound,
    StoreUnavailable,
)
from agentruns.domain.payload import JsonValue
from agentruns.domain.redaction import redact_json
from agentruns.domain.run import AgentRun

if TYPE_CHECKING:
    from agentruns.entrypoints.connect import AgentRunsClient
    from agentruns.entrypoints.console.access import ConsoleAccess

log = logging.getLogger("agentruns.stream")

# How long a browser waits before it reconnects a dropped stream (the SSE ``retry:`` field).
RETRY_MS = 1000
# Seconds of silence after which an idle stream sends a comment line (proxies close streams that
# say nothing for a minute or so; a write to a client that is gone ends the stream).
KEEPALIVE = 15.0
Authorize = Callable[[Request, AgentRun], Awaitable[bool] | bool]


def resume_point(request: Request) -> int:
    """The event to resume after: ``Last-Event-ID``, else ``?after=``, else 0; a bad one is
    :class:`~agentruns.domain.errors.InvalidRequest`."""
    given = request.headers.get("last-event-id")
    name = "Last-Event-ID"
    if given is None:
        given, name = request.query_params.get("after"), "after"
    if given is None or given.strip() == "":
        return 0
    text = given.strip()
    refused = InvalidRequest(f"{name} is an event number (0 or more), not {given[:40]!r}")
    if not text.isdigit() or not text.isascii() or len(text) > 10:
        raise refused
    try:
        return after_seq(int(text))  # the watch's own rule of a resume point
    except InvalidRequest:
        raise refused from None


def _message(event: str, data: JsonValue, seq: int | None = None) -> str:
    lines = [] if seq is None else [f"id: {seq}"]
    lines.append(f"event: {event}")
    # One line of JSON: it holds no raw newline, so it is one data field.
    lines.append("data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return "\n".join(lines) + "\n\n"


def run_view(run: AgentRun, *, redact: bool) -> JsonValue:
    """What a stream says about the run in a ``state`` or ``end`` message."""
    return {
        "id": str(run.id),
        "kind": run.kind,
        "workspace": run.workspace,
        "subject": run.subject,
        "state": run.state.value,
        "epoch": run.epoch,
        "attempt": run.attempt,
        "end_reason": None if run.end_reason is None else run.end_reason.value,
        "ended_at": None if run.ended_at is None else run.ended_at.isoformat(),
        "result": redact_json(run.result) if redact else run.result,
    }


def update_message(update: RunUpdate, *, redact: bool) -> str:
    """One SSE message for one item of a watch."""
    event = update.event
    if event is not None:
        data: JsonValue = redact_json(event.data) if redact else event.data
        body: JsonValue = {
            "seq": event.seq,
            "epoch": event.epoch,
            "type": event.type,
            "data": data,
            "created_at": event.created_at.isoformat(),
        }
        return _message("step", body, event.seq)
    return _message("end" if update.ended else "state", run_view(update.run, redact=redact))


def _refusal(status: int, text: str) -> Response:
    return PlainTextResponse(text + "\n", status_code=status)


async def open_stream(
    runs: AgentRuns,
    request: Request,
    run_id: UUID,
    *,
    authorize: Authorize | None = None,
    redact: bool = True,
    keepalive: float = KEEPALIVE,
) -> Response:
    """The SSE response of run ``run_id`` for ``request``, or the refusal that says why (400,
    403, 404, 503). The first item is read before the response starts, so a bad resume point
    or an unknown run is a status, not a broken stream."""
    try:
        after = resume_point(request)
        if authorize is not None:
            run = await runs.get(run_id)
            allowed = authorize(request, run)
            if inspect.isawaitable(allowed):
                allowed = await allowed
            if not allowed:
                return _refusal(403, "This run's stream is not yours to read.")
        updates = runs.watch(run_id, after=after)
        first = await anext(updates)
    except RunNotFound as missing:
        return _refusal(404, str(missing))
    except InvalidRequest as invalid:
        return _refusal(400, str(invalid))
    except (DatabaseTimeout, StoreUnavailable):
        return _refusal(503, "The database is unavailable; try again.")
    return StreamingResponse(
        _messages(first, updates, redact=redact, keepalive=keepalive),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _messages(
    first: RunUpdate,
    updates: AsyncGenerator[RunUpdate, None],
    *,
    redact: bool,
    keepalive: float,
) -> AsyncGenerator[str, None]:
    pending: asyncio.Future[RunUpdate] | None = None
    try:
        yield f"retry: {RETRY_MS}\n\n"
        yield update_message(first, redact=redact)
        if first.ended:
            return
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(updates))
            # The next item is awaited, never cancelled by the keep-alive: a comment line while
            # the run is idle keeps proxies from closing the stream and finds a dead client.
            done, _ = await asyncio.wait({pending}, timeout=keepalive)
            if not done:
                yield ": keep-alive\n\n"
                continue
            try:
                update = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield update_message(update, redact=redact)
            if update.ended:
                return
    except AgentRunsError as failed:  # headers are sent: say it, close, let the client resume
        log.warning("a run stream stopped", extra={"error": str(failed)})
        yield _message("error", {"message": "the stream stopped; reconnect to resume"})
    finally:
        if pending is not None and not pending.done():
            pending.cancel()  # the watch's own finally removes its row
            await asyncio.gather(pending, return_exceptions=True)
        await updates.aclose()


def create_run_stream(
    client: AgentRunsClient,
    *,
    authorize: Authorize | None = None,
    access: ConsoleAccess | None = None,
    hosts: Collection[str] = (),
    redact: bool = True,
    keepalive: float = KEEPALIVE,
) -> ASGIApp:
    """A run's live stream as an ASGI app for a host's own API: ``GET /{run_id}`` answers the
    run's Server-Sent Events (see the module docstring). Mount it under a prefix::

        app.mount("/api/runs/live", agentruns.create_run_stream(client, authorize=may_read))

    - ``authorize(request, run)`` (sync or async): the host's own rule, e.g. that the signed-in
      user belongs to ``run.workspace``; False answers 403. Without it, the console's access
      rules hold: ``access`` (a bearer token or basic auth) if given, and without ``access``
      only loopback hosts and ``hosts`` are answered (the console's defence against DNS
      rebinding); pass ``hosts=("*",)`` when the host authenticates in front of it.
    - ``redact``: hide values under secret keys and credential-shaped strings in event data and
      results, as the console does (default True).
    - ``keepalive``: seconds of an idle run after which a comment line is sent (default 15).
    """
    if not keepalive > 0:
        raise ValueError("keepalive is a positive number of seconds")
    from agentruns.entrypoints.console.access import MAX_BODY_BYTES, Gate

    runs = client.runs

    async def stream(request: Request) -> Response:
        try:
            run_id = UUID(request.path_params["run_id"].strip())
        except ValueError:
            return _refusal(400, "That is not a run id (a UUID).")
        return await open_stream(
            runs, request, run_id, authorize=authorize, redact=redact, keepalive=keepalive
        )

    app = Starlette(routes=[Route("/{run_id}", stream)])
    if authorize is not None and access is None:
        return Gate(app, None, max_body=MAX_BODY_BYTES, hosts=hosts or ("*",))
    return Gate(app, access, max_body=MAX_BODY_BYTES, hosts=hosts)
