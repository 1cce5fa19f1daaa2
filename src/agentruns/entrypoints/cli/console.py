"""``agentruns console``: the web console on this machine, or on a network with a credential."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Annotated

import typer

from agentruns.entrypoints.cli.root import DatabaseName, DataDir, KindRefs, app
from agentruns.entrypoints.cli.support import (
    CliError,
    database,
    err,
    guarded,
    load_kinds,
    postgres_container,
    settings,
    stop_on_signals,
)
from agentruns.entrypoints.connect import AgentRunsClient
from agentruns.entrypoints.container import AgentRunsContainer
from agentruns.entrypoints.settings import AgentRunsSettings

if TYPE_CHECKING:
    from agentruns.entrypoints.console import ConsoleAccess

log = logging.getLogger("agentruns.cli")

DEFAULT_PORT = 8300


@app.command()
def console(
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on. Anything but localhost needs AGENTRUNS_CONSOLE_TOKEN, or "
            "AGENTRUNS_CONSOLE_USER and AGENTRUNS_CONSOLE_PASSWORD."
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")
    ] = DEFAULT_PORT,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Show everything; offer and accept no action.")
    ] = False,
    kinds: KindRefs = None,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Serve the web console until SIGTERM or SIGINT: the overview, workspaces, runs, schedules
    and sandboxes, and the actions (cancel, retry a dead letter, budget holds, inactive
    workspaces). Retrying, or cancelling a kind with a domain row, needs its --kinds."""

    def body() -> None:
        try:
            from agentruns.entrypoints.console import is_local
        except ImportError as exc:
            raise CliError(
                "the console needs its extra: pip install 'agentruns[console]' "
                f"({exc.name} is missing)"
            ) from None

        config = settings()
        access = _access(config)
        if access is None and not is_local(host):
            raise CliError(
                f"--host {host} is not this machine only: set AGENTRUNS_CONSOLE_TOKEN, or "
                "AGENTRUNS_CONSOLE_USER and AGENTRUNS_CONSOLE_PASSWORD, to serve the console there"
            )
        registry = load_kinds(kinds or [])
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url, registry, process="console")
            asyncio.run(_serve(built, host, port, read_only, access, config.console_host_names))

    guarded(body)


def _access(config: AgentRunsSettings) -> ConsoleAccess | None:
    from agentruns.entrypoints.console import ConsoleAccess

    token = config.console_token.get_secret_value() if config.console_token else None
    password = config.console_password.get_secret_value() if config.console_password else None
    if token is None and config.console_user is None and password is None:
        return None
    try:
        return ConsoleAccess(token=token, user=config.console_user, password=password)
    except ValueError as exc:
        raise CliError(f"the console's credential: {exc}") from None


async def _serve(
    built: AgentRunsContainer,
    host: str,
    port: int,
    read_only: bool,
    access: ConsoleAccess | None,
    hosts: tuple[str, ...],
) -> None:
    from agentruns.entrypoints.console import create_console
    from agentruns.entrypoints.http import serve

    client = AgentRunsClient(built, url=built.settings().database_url)
    stop = asyncio.Event()
    stop_on_signals(stop)
    serving: list[str] = []

    def started(url: str) -> None:
        serving.append(url)
        err.print(f"agentruns: the console is at {url}/", markup=False)
        log.info("console started", extra={"url": url, "read_only": read_only})

    try:
        app = create_console(
            client,
            access=access,
            read_only=read_only,
            hosts=hosts,
        )
        await serve(app, host, port, stop, started=started, grace=2.0)
    except OSError as exc:
        raise CliError(f"cannot serve the console on {host}:{port}: {exc.strerror or exc}") from exc
    finally:
        if serving:
            log.info("console stopped", extra={"url": serving[0]})
        await client.close()
