"""``agentruns schedules``: see the schedules, sync them, pause and resume them; and the
scheduler loop the ``worker`` and ``reaper`` commands run beside their own work."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

import typer
from rich.console import Group, RenderableType
from rich.text import Text

from agentruns.app.schedules import SyncReport
from agentruns.domain.errors import RunNotFound
from agentruns.domain.run import AgentRun
from agentruns.domain.ticks import ScheduleState
from agentruns.domain.timing import zone
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.cli.root import DatabaseName, DataDir, KindRefs, app, out
from agentruns.entrypoints.cli.support import (
    CliError,
    database,
    guarded,
    postgres_container,
    required_kinds,
    settings,
)
from agentruns.entrypoints.container import AgentRunsContainer

log = logging.getLogger("agentruns.cli")

schedules_app = typer.Typer(help="Schedules of runs declared with the kinds.", no_args_is_help=True)
app.add_typer(schedules_app, name="schedules")

Name = Annotated[str, typer.Argument(help="The schedule's name")]


@dataclass(frozen=True, slots=True)
class _Listed:
    state: ScheduleState
    last_run: AgentRun | None


def _moment(value: datetime | None, timezone: str) -> str:
    return "-" if value is None else value.astimezone(zone(timezone)).isoformat(sep=" ")


def _timing(state: ScheduleState) -> str:
    schedule = state.schedule
    if schedule.cron is not None:
        return f"cron {schedule.cron} ({schedule.timezone})"
    assert schedule.every is not None  # a schedule has one or the other
    return f"every {int(schedule.every.total_seconds())}s"


def _status(state: ScheduleState) -> str:
    if state.removed_at is not None:
        return "removed"
    return "paused" if state.paused else "active"


def _run_text(listed: _Listed) -> str:
    if listed.state.last_run is None:
        return "-"
    if listed.last_run is None:
        return f"{listed.state.last_run} (purged)"
    run = listed.last_run
    return f"{run.id} ({run.end_reason or run.state})"


def _fields(listed: _Listed) -> dict[str, object]:
    state, schedule = listed.state, listed.state.schedule
    run = listed.last_run
    return {
        "name": schedule.name,
        "kind": schedule.kind,
        "cron": schedule.cron,
        "every_seconds": None if schedule.every is None else schedule.every.total_seconds(),
        "timezone": schedule.timezone,
        "workspace": schedule.workspace,
        "subject": schedule.subject,
        "catch_up": str(schedule.catch_up),
        "status": _status(state),
        "next_tick": None if state.next_tick_at is None else state.next_tick_at.isoformat(),
        "last_tick": None if state.last_tick_at is None else state.last_tick_at.isoformat(),
        "last_run": None if state.last_run is None else str(state.last_run),
        "last_run_state": None if run is None else str(run.end_reason or run.state),
        "added_at": state.created_at.isoformat(),
        "changed_at": state.updated_at.isoformat(),
        "removed_at": None if state.removed_at is None else state.removed_at.isoformat(),
    }


def _listing(listed: list[_Listed]) -> Group:
    """One block per schedule (readable at 80 columns, where a table of seven would fold)."""
    blocks: list[RenderableType] = []
    for one in listed:
        state = one.state
        timezone = state.schedule.timezone
        status = _status(state)
        head = Text.assemble(
            (state.name, "bold"),
            f"  {state.schedule.kind}  {_timing(state)}  ",
            (status, "green" if status == "active" else "yellow"),
        )
        next_tick = "-" if not state.active else _moment(state.next_tick_at, timezone)
        blocks.append(head)
        blocks.append(Text(f"  next tick  {next_tick}"))
        blocks.append(Text(f"  last tick  {_moment(state.last_tick_at, timezone)}"))
        blocks.append(Text(f"  last run   {_run_text(one)}"))
        changed = f"  added      {_moment(state.created_at, timezone)}"
        if state.updated_at != state.created_at:
            changed += f"; changed {_moment(state.updated_at, timezone)}"
        if state.removed_at is not None:
            changed += f"; removed {_moment(state.removed_at, timezone)}"
        blocks.append(Text(changed))
    return Group(*blocks)


@schedules_app.command("list")
def schedules_list(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array, for scripts")] = False,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Every schedule: when it ticks, its next tick, its last tick and that tick's run."""

    def body() -> None:
        config = settings()
        with database(config, data_dir, database_name) as url:
            listed = asyncio.run(_list(postgres_container(config, url, process="scheduler")))
        if as_json:
            print(json.dumps([_fields(one) for one in listed], indent=2))
        elif not listed:
            out.print("no schedules: declare them with the kinds and run `schedules sync`")
        else:
            out.print(_listing(listed))

    guarded(body)


async def _list(built: AgentRunsContainer) -> list[_Listed]:
    try:
        runs = built.runs()
        listed = []
        for state in await built.schedules().all():
            last_run = None
            if state.last_run is not None:
                with contextlib.suppress(RunNotFound):  # purged since
                    last_run = await runs.get(state.last_run)
            listed.append(_Listed(state, last_run))
        return listed
    finally:
        await composition.close(built)


@schedules_app.command("pause")
def schedules_pause(
    name: Name, data_dir: DataDir = None, database_name: DatabaseName = None
) -> None:
    """Stop a schedule ticking until it is resumed (a sync on start keeps it paused)."""
    _operate(name, "pause", data_dir, database_name)


@schedules_app.command("resume")
def schedules_resume(
    name: Name, data_dir: DataDir = None, database_name: DatabaseName = None
) -> None:
    """Tick a paused schedule again, from its first tick after now."""
    _operate(name, "resume", data_dir, database_name)


def _operate(
    name: str, action: Literal["pause", "resume"], data_dir: DataDir, database_name: str | None
) -> None:
    def body() -> None:
        config = settings()
        with database(config, data_dir, database_name) as url:
            state = asyncio.run(
                _apply(postgres_container(config, url, process="scheduler"), name, action)
            )
        if action == "pause":
            out.print(f"schedule {name} paused")
        else:
            next_tick = _moment(state.next_tick_at, state.schedule.timezone)
            out.print(f"schedule {name} resumed; next tick {next_tick}")

    guarded(body)


async def _apply(
    built: AgentRunsContainer, name: str, action: Literal["pause", "resume"]
) -> ScheduleState:
    try:
        schedules = built.schedules()
        state = await schedules.get(name)
        if state.removed_at is not None:
            raise CliError(f"schedule {name!r} was removed from the code: nothing ticks it")
        if action == "pause":
            return await schedules.pause(name)
        return await schedules.resume(name)
    finally:
        await composition.close(built)


@schedules_app.command("sync")
def schedules_sync(
    kinds: KindRefs = None, data_dir: DataDir = None, database_name: DatabaseName = None
) -> None:
    """Write the schedules the kinds declare to the table now (the worker and reaper commands
    do it on start): added, changed and removed ones are shown."""

    def body() -> None:
        config = settings()
        registry = required_kinds(kinds)
        with database(config, data_dir, database_name) as url:
            report = asyncio.run(
                _sync(postgres_container(config, url, registry, process="scheduler"))
            )
        for what, names in (
            ("added", report.added),
            ("changed", report.changed),
            ("removed", report.removed),
        ):
            for name in names:
                out.print(f"schedule {name} {what}")
        out.print(
            f"{len(report.added)} added, {len(report.changed)} changed, "
            f"{len(report.removed)} removed, {len(report.unchanged)} unchanged"
        )

    guarded(body)


async def _sync(built: AgentRunsContainer) -> SyncReport:
    try:
        return await built.schedules().sync()
    finally:
        await composition.close(built)


# -- the scheduler beside a long-running command ----------------------------------------------


async def start_scheduler(
    built: AgentRunsContainer, role: Literal["worker", "reaper"], stop: asyncio.Event
) -> asyncio.Task[None] | None:
    """If the settings run the scheduler in ``role`` (``AGENTRUNS_SCHEDULER``), sync the
    declared schedules now (an error stops the command like any other) and start the loop
    until ``stop``; the caller awaits the task it gets."""
    config = built.settings()
    if config.scheduler not in ("both", role):
        return None
    report = await built.schedules().sync()
    every = config.scheduler_interval.total_seconds()
    log.info(
        "scheduler started",
        extra={
            "every": every,
            "added": len(report.added),
            "changed": len(report.changed),
            "removed": len(report.removed),
        },
    )
    return asyncio.create_task(built.scheduler().run(stop, every=every))
