"""What every command needs: settings, the database, kinds and sandboxes from
``module:object``, durations, times and ports, confirmations, and errors as one line."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn, TypeVar

import typer
from dependency_injector import providers
from pydantic import ValidationError
from rich.console import Console

from agentruns.app.kinds import RunKind, RunKinds
from agentruns.domain.durations import parse_duration
from agentruns.domain.errors import AgentRunsError, InvalidDuration
from agentruns.domain.schedule import Schedule
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.container import AgentRunsContainer, SandboxHosting
from agentruns.entrypoints.settings import AgentRunsSettings

T = TypeVar("T")

DEFAULT_DATA_DIR = Path(".agentruns/pgdata")

err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


class CliError(Exception):
    """An error an operator can fix: shown as one line, exit status 1."""


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"agentruns: error: {message}", markup=False)
    raise typer.Exit(code)


def guarded(action: Callable[[], T]) -> T:
    """Run a command's body: operator errors become one line and exit 1, never a traceback."""
    try:
        return action()
    except typer.Exit:
        raise
    except (CliError, AgentRunsError) as exc:
        fail(_one_line(exc))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]).upper()
        named = where if where.startswith("AGENTRUNS_") else f"AGENTRUNS_{where}"  # an alias
        fail(f"invalid setting {named}: {first['msg']}")
    except KeyboardInterrupt:
        fail("interrupted", 130)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


# The root command's -v, for the command it runs (set once per invocation, before the command).
VERBOSE: ContextVar[bool] = ContextVar("agentruns_cli_verbose", default=False)


def settings() -> AgentRunsSettings:
    return AgentRunsSettings()


@contextmanager
def database(
    config: AgentRunsSettings, data_dir: Path | None = None, name: str | None = None
) -> Iterator[str]:
    """The configured URL, or an embedded PostgreSQL in ``data_dir`` (and say so on stderr);
    with ``name``, that database on the same server. Its connections use ``AGENTRUNS_SCHEMA``."""
    if config.database_url:
        yield _named(config, config.database_url, name)
        return
    folder = data_dir or DEFAULT_DATA_DIR
    # Said when it is news: the command that creates the server, or with -v. Every command of
    # a script or a terminal session repeated it on stderr, where a real error has to stand out;
    # `agentruns db url` says where the data is whenever it is asked.
    if VERBOSE.get() or not (folder / "PG_VERSION").exists():
        err.print(
            f"agentruns: AGENTRUNS_DATABASE_URL is not set: using the embedded PostgreSQL in "
            f"{folder}/",
            markup=False,
        )
    with composition.embedded_database(folder) as url:
        yield _named(config, url, name)


def _named(config: AgentRunsSettings, url: str, name: str | None) -> str:
    named = url if name is None else composition.database_named(url, name)
    return composition.in_schema(named, config.database_schema)


# The commands whose transactions run under AGENTRUNS_READ_TIMEOUT: an operator's reads (and
# the few writes beside them), never a worker's, reaper's or gateway's.
_BOUNDED_READS = ("cli", "console", "scheduler")


def postgres_container(
    config: AgentRunsSettings,
    url: str,
    kinds: RunKinds | None = None,
    sandboxes: SandboxHosting | None = None,
    *,
    process: str = "cli",
    holder: str | None = None,
) -> AgentRunsContainer:
    """A container on the PostgreSQL at ``url`` (checked: reachable and migrated), whose
    connections name ``process`` (and the worker's ``holder``) in ``pg_stat_activity``."""
    options = composition.connection_options(
        config,
        composition.process_name(process, holder),
        bounded_reads=process in _BOUNDED_READS,
    )
    composition.check_database(url, options)
    built = AgentRunsContainer()
    built.connections.override(providers.Object(options))
    built.settings.override(providers.Object(config.model_copy(update={"database_url": url})))
    if kinds is not None:
        built.kinds.override(providers.Object(kinds))
    if sandboxes is not None:
        composition.use_sandboxes(built, sandboxes)
    composition.use_postgres(built, url)
    return built


def required_kinds(refs: list[str] | None) -> RunKinds:
    registry = load_kinds(refs or [])
    if not registry.names():
        raise CliError("no run kinds: pass --kinds module:object")
    return registry


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop``: a long-running command stops gracefully on either."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)


def load_kinds(refs: Iterable[str]) -> RunKinds:
    """Kinds named ``module:object``; the object is a RunKinds (with the schedules it
    declares), a RunKind, an iterable of RunKind, or a callable without arguments that returns
    one of those."""
    registry = RunKinds()
    schedules: list[Schedule] = []
    for ref in refs:
        kinds, declared = _kinds_of(ref)
        for kind in kinds:
            registry.register(kind)
        schedules.extend(declared)
    for schedule in schedules:  # once every kind is in: a schedule may name another ref's kind
        registry.schedule(schedule)
    return registry


def importable_here() -> None:
    """Put the current folder first on the import path, as ``python -m`` and uvicorn do, so
    ``--kinds myapp.kinds:KINDS`` finds the project it is run from."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def _resolve(ref: str, option: str) -> object:
    """The object ``module:object`` names (a dotted attribute path is followed), imported from
    the current folder too."""
    module_name, sep, attribute = ref.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"{option} takes module:object, not {ref!r}")
    importable_here()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        # A module that is missing, does not compile, or whose import raises (a SandboxHosting
        # that refuses its own arguments) is an operator's fix: one line that names the error.
        raise CliError(
            f"cannot import {module_name!r} for {option} {ref}: {type(exc).__name__}: {exc}"
        ) from exc
    found: object = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise CliError(f"{module_name!r} has no {attribute!r} ({option} {ref})") from None
    return found


def _factory(found: object, ref: str, option: str) -> object:
    """What a factory named by ``option`` returns: only a Python function without required
    parameters is called (``os:system``, a class or a builtin is not), and what it raises is
    one line."""
    if not inspect.isfunction(found):
        return found
    required = [
        parameter
        for parameter in inspect.signature(found).parameters.values()
        if parameter.default is inspect.Parameter.empty
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]
    if required:
        raise CliError(f"{option} {ref} is a function that needs arguments: name an object")
    try:
        return found()
    except Exception as exc:
        raise CliError(f"{option} {ref}: {type(exc).__name__}: {exc}") from exc


def _kinds_of(ref: str) -> tuple[list[RunKind], list[Schedule]]:
    found = _factory(_resolve(ref, "--kinds"), ref, "--kinds")
    if isinstance(found, RunKinds):
        return [found.get(name) for name in found.names()], list(found.schedules)
    if isinstance(found, RunKind):
        return [found], []
    if isinstance(found, Iterable):
        kinds = list(found)
        if all(isinstance(kind, RunKind) for kind in kinds):
            return [kind for kind in kinds if isinstance(kind, RunKind)], []
    raise CliError(f"--kinds {ref} is not a RunKinds, a RunKind or a list of RunKind")


def load_sandboxes(ref: str, kinds: RunKinds) -> SandboxHosting:
    """The host's sandboxes named ``module:object``: a :class:`SandboxHosting`, or a callable
    without arguments that returns one. Every run kind its sandbox kinds drive must be among
    ``kinds``, or a sandbox's calls would be refused one by one."""
    found = _factory(_resolve(ref, "--sandboxes"), ref, "--sandboxes")
    if not isinstance(found, SandboxHosting):
        raise CliError(f"--sandboxes {ref} is not a SandboxHosting")
    registered = set(kinds.names())
    for sandbox_kind in found.kinds:
        for run_kind in sandbox_kind.runs:
            if run_kind not in registered:
                raise CliError(
                    f"sandbox kind {sandbox_kind.name!r} drives run kind {run_kind!r}, "
                    "which --kinds does not register"
                )
    return found


def duration(text: str, option: str) -> timedelta:
    """``text`` as a duration (the settings' parser), or one line naming the option."""
    try:
        return parse_duration(text)
    except AgentRunsError as exc:
        raise CliError(f"{option}: {exc}") from None


def moment(text: str, option: str, now: datetime) -> datetime:
    """A time given as a duration from ``now`` (``10m``) or as an ISO 8601 time with its zone
    (``2026-05-01T09:00:00+00:00``; a ``Z`` works too)."""
    try:
        return now + parse_duration(text)
    except InvalidDuration as exc:
        refused: InvalidDuration | None = exc
    except OverflowError:
        raise CliError(f"{option}: {text!r} from now is past the year 9999") from None
    try:
        found = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        pass
    else:
        if found.tzinfo is None:
            raise CliError(f"{option}: {text!r} has no time zone (add +00:00 or Z)")
        try:
            return found.astimezone(UTC)
        except OverflowError:
            raise CliError(f"{option}: {text!r} falls outside the years 1 to 9999 in UTC") from None
    stripped = text.strip()
    if stripped.startswith("-") and _is_duration(stripped[1:]):
        raise CliError(
            f"{option}: {text!r} is negative: give a duration from now (10m, 2h) or an ISO 8601 "
            "time"
        )
    if refused is not None and "is not a duration" not in str(refused):
        raise CliError(f"{option}: {refused}")  # a duration, out of range: the parser's reason
    raise CliError(
        f"{option}: {text!r} is neither a duration from now (10m, 2h) nor an ISO 8601 time"
    )


def _is_duration(text: str) -> bool:
    try:
        parse_duration(text)
    except InvalidDuration:
        return False
    return True


def port(value: int | None, option: str) -> int | None:
    """A TCP port (0 picks a free one), or one line saying it is none."""
    if value is not None and not 0 <= value <= 65535:
        raise CliError(f"{option} {value} is not a port: choose 0 to 65535")
    return value


def is_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def confirm(question: str) -> bool:
    """Ask on a terminal; ``False`` unless the answer is yes."""
    answer = typer.prompt(f"{question} [y/N]", default="", show_default=False)
    return answer.strip().lower() in ("y", "yes")
