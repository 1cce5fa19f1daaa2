"""Commands an operator inspects and steers with: ``status``, ``runs``, ``purge``."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Annotated
from uuid import UUID

import typer
from rich.console import RenderableType

from agentruns.app.stats import RunStatus
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.cli import render
from agentruns.entrypoints.cli.root import DataDir, KindRefs, app, out, runs_app
from agentruns.entrypoints.cli.support import (
    CliError,
    database,
    guarded,
    load_kinds,
    parse_duration,
    postgres_container,
    settings,
)
from agentruns.entrypoints.container import AgentRunsContainer

# -- status, runs, purge --------------------------------------------------------------------


@app.command()
def status(
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object, for scripts and monitors")
    ] = False,
    data_dir: DataDir = None,
) -> None:
    """Runs by state, band, workspace and end reason; expired leases; the oldest due run's
    wait; budget holds."""

    def body() -> None:
        config = settings()
        with database(config, data_dir) as url:
            built = postgres_container(config, url)
            report = asyncio.run(_status(built))
        if as_json:
            print(json.dumps(render.status_fields(report), indent=2))
        else:
            out.print(render.status(report))

    guarded(body)


async def _status(built: AgentRunsContainer) -> RunStatus:
    try:
        async with built.stores().scope.transaction() as tx:
            found: RunStatus = await built.run_stats().status(tx)
            return found
    finally:
        await composition.close(built)


def _run_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise CliError(f"{text!r} is not a run id (a UUID)") from None


@runs_app.command("show")
def runs_show(run_id: str, data_dir: DataDir = None) -> None:
    """A run, its epochs and its events."""

    def body() -> None:
        config = settings()
        wanted = _run_id(run_id)
        with database(config, data_dir) as url:
            built = postgres_container(config, url)
            shown = asyncio.run(_show(built, wanted))
        out.print(shown)

    guarded(body)


async def _show(built: AgentRunsContainer, run_id: UUID) -> RenderableType:
    try:
        use_cases = built.runs()
        run = await use_cases.get(run_id)
        return render.run(run, await use_cases.events(run_id))
    finally:
        await composition.close(built)


@runs_app.command("cancel")
def runs_cancel(run_id: str, kinds: KindRefs = None, data_dir: DataDir = None) -> None:
    """End a queued or leased run CANCELLED now; its holder stops at its next step.

    A kind with a domain row of its own needs its --kinds, so that its row moves too."""

    def body() -> None:
        config = settings()
        wanted = _run_id(run_id)
        registry = load_kinds(kinds or [])
        with database(config, data_dir) as url:
            built = postgres_container(config, url, registry)
            ended = asyncio.run(_cancel(built, wanted))
        out.print(f"run {ended.id} cancelled at epoch {ended.epoch}")

    guarded(body)


async def _cancel(built: AgentRunsContainer, run_id: UUID) -> AgentRun:
    try:
        use_cases = built.runs()
        run = await use_cases.get(run_id)
        if run.kind not in use_cases.kinds:
            raise CliError(
                f"run {run_id} is of kind {run.kind!r}: load it with --kinds module:object"
            )
        if run.state is AgentRunState.ENDED:
            raise CliError(f"run {run_id} has already ended ({run.end_reason})")
        return await use_cases.cancel(run_id)
    finally:
        await composition.close(built)


@app.command()
def purge(
    older_than: Annotated[
        str, typer.Option(help="Delete runs that ended longer ago than this (7d, 12h, 30m)")
    ] = "7d",
    data_dir: DataDir = None,
) -> None:
    """Delete ended runs (and their events) past the retention."""

    def body() -> None:
        retention = parse_duration(older_than)
        config = settings()
        with database(config, data_dir) as url:
            built = postgres_container(config, url)
            deleted = asyncio.run(_purge(built, retention))
        out.print(f"purged {deleted} runs that ended more than {older_than} ago")

    guarded(body)


async def _purge(built: AgentRunsContainer, retention: timedelta) -> int:
    try:
        return await built.runs().purge(retention)
    finally:
        await composition.close(built)
