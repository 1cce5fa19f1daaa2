"""The ``agentruns`` application, its sub-groups and the options every command shares.

Every error reaches the operator as one line on stderr (``agentruns: error: ...``) and exit
status 1: those the commands raise (:func:`~agentruns.entrypoints.cli.support.guarded`) and those
the parser raises for a bad option (a port that is not a number, an option that does not exist),
which click would otherwise show as a framed usage panel with exit status 2 (ADRs/0014).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

import agentruns
from agentruns.entrypoints.cli.support import VERBOSE
from agentruns.entrypoints.logs import LogFormat, configure_logging

_err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)

# The parser's error root, whichever click typer runs on (its own copy, or click itself).
_PARSER_ERRORS: tuple[type[Exception], ...] = tuple(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)
_USAGE_ERRORS: tuple[type[Exception], ...] = tuple(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)


class OneLineErrors(TyperGroup):
    """The root group: a parser error becomes one line and exit status 1, like any other."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except _PARSER_ERRORS as exc:
            message = " ".join(str(getattr(exc, "format_message", exc.__str__)()).split())
            context = getattr(exc, "ctx", None)
            if isinstance(exc, _USAGE_ERRORS) and context is not None:
                message += f" (see `{context.command_path} --help`)"
            _err.print(f"agentruns: error: {message}", markup=False)
            sys.exit(1)
        except typer.Abort:
            _err.print("agentruns: error: aborted", markup=False)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="agentruns",
    cls=OneLineErrors,
    help="Lease long-running AI-agent work to workers on PostgreSQL, and never lose it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The database: its schema and the embedded server.", no_args_is_help=True)
runs_app = typer.Typer(help="Runs: list, show, cancel, signal, retry.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")

out = Console(highlight=False, soft_wrap=True, emoji=False)

DataDir = Annotated[
    Path | None,
    typer.Option(
        help="Data folder of the embedded PostgreSQL, used when AGENTRUNS_DATABASE_URL is unset.",
        show_default=".agentruns/pgdata",
    ),
]
DatabaseName = Annotated[
    str | None,
    typer.Option(
        "--database",
        help="Another database on the same server (the demo's is agentruns_demo).",
        show_default="the URL's, or postgres on the embedded server",
    ),
]
KindRefs = Annotated[
    list[str] | None,
    typer.Option(
        "--kinds",
        help="Run kinds to load, as module:object (a RunKinds, a RunKind, a list of them, or a "
        "callable returning one), imported from the current folder too; repeat for more.",
        show_default="none",
    ),
]

SandboxesRef = Annotated[
    str | None,
    typer.Option(
        "--sandboxes",
        help="The host's sandboxes, as module:object (a SandboxHosting, or a callable returning "
        "one): its sandbox kinds, signing keys and claims adapter.",
        show_default="none",
    ),
]


def _show_version(value: bool) -> None:
    if value:
        print(f"agentruns {agentruns.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    log_format: Annotated[str, typer.Option(help="Log lines as json or kv.")] = "kv",
    log_level: Annotated[str, typer.Option(help="Log level.")] = "info",
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_show_version, help="Print the version and exit."
        ),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Say which database a command uses when AGENTRUNS_DATABASE_URL is not set.",
        ),
    ] = False,
) -> None:
    VERBOSE.set(verbose)
    if log_format not in ("json", "kv"):
        raise typer.BadParameter("choose json or kv", param_hint="--log-format")
    chosen: LogFormat = "json" if log_format == "json" else "kv"
    if log_level.upper() not in logging.getLevelNamesMapping():
        raise typer.BadParameter("choose debug, info, warning or error", param_hint="--log-level")
    configure_logging(level=log_level.upper(), format=chosen)
