"""``agentruns gateway``: the HTTP gateway a host's sandboxes call with their tokens."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from agentruns.entrypoints import container as composition
from agentruns.entrypoints.cli.root import DatabaseName, DataDir, KindRefs, SandboxesRef, app
from agentruns.entrypoints.cli.support import (
    CliError,
    database,
    guarded,
    load_sandboxes,
    postgres_container,
    required_kinds,
    settings,
    stop_on_signals,
)
from agentruns.entrypoints.container import AgentRunsContainer

log = logging.getLogger("agentruns.cli")

DEFAULT_PORT = 8081


@app.command()
def gateway(
    kinds: KindRefs = None,
    sandboxes: SandboxesRef = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on: only the network the sandboxes reach.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")
    ] = DEFAULT_PORT,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Serve the sandbox gateway (/internal/agent/**) until SIGTERM or SIGINT, then let calls in
    flight finish within AGENTRUNS_SHUTDOWN_GRACE."""

    def body() -> None:
        config = settings()
        registry = required_kinds(kinds)
        if sandboxes is None:
            raise CliError("no sandboxes: pass --sandboxes module:object")
        hosting = load_sandboxes(sandboxes, registry)
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url, registry, hosting, process="gateway")
            names = ",".join(kind.name for kind in hosting.kinds)
            asyncio.run(_serve(built, host, port, names))

    guarded(body)


async def _serve(built: AgentRunsContainer, host: str, port: int, sandbox_kinds: str) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)
    serving: list[str] = []

    def started(url: str) -> None:
        serving.append(url)
        log.info("gateway started", extra={"url": url, "sandbox_kinds": sandbox_kinds})

    try:
        await composition.serve_gateway(built, host, port, stop, started)
    except OSError as exc:
        raise CliError(f"cannot serve the gateway on {host}:{port}: {exc.strerror or exc}") from exc
    finally:
        if serving:
            log.info("gateway stopped", extra={"url": serving[0]})
        await composition.close(built)
