"""The ``agentruns`` application, its sub-groups and the options every command shares."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from agentruns.entrypoints.logs import LogFormat, configure_logging

app = typer.Typer(
    name="agentruns",
    help="Lease long-running AI-agent work to workers on PostgreSQL, and never lose it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The database schema.", no_args_is_help=True)
runs_app = typer.Typer(help="One run.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")

out = Console(highlight=False)

DataDir = Annotated[
    Path | None,
    typer.Option(
        help="Data folder of the embedded PostgreSQL, used when AGENTRUNS_DATABASE_URL is unset "
        "[default: .agentruns/pgdata]",
        show_default=False,
    ),
]
KindRefs = Annotated[
    list[str] | None,
    typer.Option(
        "--kinds",
        help="Run kinds to load, as module:object (a RunKinds, a RunKind, a list of them, or a "
        "callable returning one); repeat for more.",
    ),
]

SandboxesRef = Annotated[
    str | None,
    typer.Option(
        "--sandboxes",
        help="The host's sandboxes, as module:object (a SandboxHosting, or a callable returning "
        "one): its sandbox kinds, signing keys and claims adapter.",
    ),
]


@app.callback()
def _root(
    log_format: Annotated[str, typer.Option(help="Log lines as json or kv.")] = "kv",
    log_level: Annotated[str, typer.Option(help="Log level.")] = "info",
) -> None:
    if log_format not in ("json", "kv"):
        raise typer.BadParameter("choose json or kv", param_hint="--log-format")
    chosen: LogFormat = "json" if log_format == "json" else "kv"
    if log_level.upper() not in logging.getLevelNamesMapping():
        raise typer.BadParameter("choose debug, info, warning or error", param_hint="--log-level")
    configure_logging(level=log_level.upper(), format=chosen)
