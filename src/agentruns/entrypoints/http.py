"""Serving an ASGI app of ours (the sandbox gateway, the console) with uvicorn until a stop event.

The port is bound before uvicorn starts, so a port in use is an :class:`OSError` the command
turns into one line, and a caller that connects before uvicorn accepts waits instead of failing.
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import uvicorn
from starlette.types import ASGIApp


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
    app: ASGIApp,
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
