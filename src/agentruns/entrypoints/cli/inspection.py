"""Commands an operator inspects and steers with: ``status``, ``enqueue``, ``runs``, ``purge``."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated, TypeVar
from uuid import UUID

import typer
from rich.console import RenderableType

from agentruns.app.runs import AgentRuns, Enqueued
from agentruns.app.stats import RunStatus
from agentruns.domain import limits
from agentruns.domain.bands import Band
from agentruns.domain.errors import RunNotFound, UnknownKind
from agentruns.domain.holders import HolderView
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.subject_policy import OnActive
from agentruns.domain.waits import Delivered
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.cli import holders, render
from agentruns.entrypoints.cli.root import DatabaseName, DataDir, KindRefs, app, out, runs_app
from agentruns.entrypoints.cli.support import (
    CliError,
    confirm,
    database,
    duration,
    err,
    guarded,
    is_terminal,
    load_kinds,
    moment,
    postgres_container,
    required_kinds,
    settings,
)
from agentruns.entrypoints.container import AgentRunsContainer

T = TypeVar("T")

AsJson = Annotated[bool, typer.Option("--json", help="One JSON object, for scripts and monitors.")]


def _using(built: AgentRunsContainer, action: Callable[[AgentRunsContainer], Awaitable[T]]) -> T:
    """Run ``action`` on the container's use cases and release the container after it."""

    async def run() -> T:
        try:
            return await action(built)
        finally:
            await composition.close(built)

    return asyncio.run(run())


# -- status ---------------------------------------------------------------------------------


@app.command()
def status(
    as_json: AsJson = False,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Where the database is; runs by state, band, workspace and end reason; expired and
    orphaned leases; the oldest due run's wait; budget holds; the holders (live and gone, with
    their process names), quiet leases, and queued runs of kinds no live holder claims."""

    def body() -> None:
        config = settings()
        # A lease expired for three reaper ticks has no reaper that knows its kind.
        orphan_after = config.lease_renewal * 3
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url)
            report, held = _using(built, _status)
            where = composition.shown_url(url)
        if as_json:
            fields = {
                "database": where,
                **render.status_fields(report, orphan_after),
                **holders.fields(held),
            }
            print(json.dumps(fields, indent=2))
        else:
            print(f"database: {where}")
            out.print(render.status(report, orphan_after))
            out.print(holders.holders(held))

    guarded(body)


async def _status(built: AgentRunsContainer) -> tuple[RunStatus, HolderView]:
    async with built.stores().scope.transaction() as tx:
        found: RunStatus = await built.run_stats().status(tx)
    held: HolderView = await built.holders().view()
    return found, held


# -- enqueue --------------------------------------------------------------------------------


@app.command()
def enqueue(
    kind: Annotated[str, typer.Argument(help="The run kind (registered by --kinds).")],
    kinds: KindRefs = None,
    workspace: Annotated[str, typer.Option(help="The tenant the run belongs to.")] = "default",
    subject: Annotated[
        str | None,
        typer.Option(
            help="What the run works on; a subject's runs go one at a time, in order.",
            show_default="KIND:the enqueue time (a subject of its own)",
        ),
    ] = None,
    band: Annotated[str, typer.Option(help="interactive, batch or background.")] = "batch",
    payload: Annotated[str, typer.Option(help="The run's input, a JSON object.")] = "{}",
    due: Annotated[
        str | None,
        typer.Option(
            help="Not before: a duration from now (10m) or an ISO 8601 time.", show_default="now"
        ),
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(
            help="Give up after: a duration from now (2h) or an ISO 8601 time.",
            show_default="the kind's deadline",
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            help="Enqueue at most once: a run this key still names in the workspace is "
            "printed instead of a new one (the default subject is then KIND:KEY).",
            show_default="none",
        ),
    ] = None,
    on_active: Annotated[
        str | None,
        typer.Option(
            "--on-active",
            help="When the subject has a run that has not ended: queue behind it, reject "
            "(nothing is written, exit 1), interrupt it (cancelled; the new run is next) or "
            "merge (join its newest run if never claimed; no new run).",
            show_default="the kind's policy",
        ),
    ] = None,
    debounce: Annotated[
        float | None,
        typer.Option(
            "--debounce",
            help="With merge: the run is not claimed until SECONDS after the last work "
            "that joined it (at most the kind's debounce_max_wait after its first).",
            show_default="the kind's debounce",
        ),
    ] = None,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Queue a run; print its id (alone on stdout, for scripts). With --key, stderr says
    whether the run is new or was already enqueued with that key; with merge, whether the work
    made a run or joined one."""

    def body() -> None:
        config = settings()
        registry = required_kinds(kinds)
        if kind not in registry:
            raise UnknownKind(kind)
        try:
            data = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise CliError(f"--payload is not JSON: {exc}") from None
        except RecursionError:
            raise CliError(
                f"--payload is nested deeper than {limits.MAX_JSON_DEPTH} levels"
            ) from None
        Band.parse(band)
        policy = None if on_active is None else OnActive.parse(on_active)
        merging = (policy or registry.get(kind).policy.on_active) is OnActive.MERGE
        window = None if debounce is None else _seconds(debounce, "--debounce")
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url, registry)

            async def action(built: AgentRunsContainer) -> Enqueued:
                runs = built.runs()
                async with runs.transaction() as tx:
                    now = await runs.stores.runs.now(tx)
                if subject is not None:
                    named = subject
                else:
                    named = f"{kind}:{now.timestamp():.6f}" if key is None else f"{kind}:{key}"
                due_at = None if due is None else moment(due, "--due", now)
                deadline_at = None if deadline is None else moment(deadline, "--deadline", now)
                if key is not None or merging:
                    return await runs.enqueue_once(
                        kind,
                        workspace=workspace,
                        subject=named,
                        key=key,
                        band=band,
                        payload=data,
                        due_at=due_at,
                        deadline_at=deadline_at,
                        on_active=policy,
                        debounce=window,
                    )
                run = await runs.enqueue(
                    kind, workspace=workspace, subject=named, band=band, payload=data,
                    due_at=due_at, deadline_at=deadline_at, on_active=policy, debounce=window,
                )  # fmt: skip
                return Enqueued(run, created=True)

            done = _using(built, action)
        print(done.run.id)
        if key is not None and done.created:
            err.print(f"agentruns: new run, key {key!r}", markup=False)
        elif key is not None:
            err.print(
                f"agentruns: already enqueued with key {key!r}: run {done.run.id} is "
                f"{done.run.state}, nothing new was written",
                markup=False,
            )
        elif merging:
            joined = "a new run" if done.created else f"merged into run {done.run.id}, no new run"
            err.print(f"agentruns: {joined}, due {done.run.due_at.isoformat()}", markup=False)

    guarded(body)


# -- runs -----------------------------------------------------------------------------------


def _seconds(value: float, option: str) -> timedelta:
    """``value`` seconds as a duration, or one line naming ``option``."""
    if not math.isfinite(value) or value <= 0 or value > limits.MAX_DELAY.total_seconds():
        raise CliError(f"{option} is a number of seconds above 0 and at most a year and a day")
    return timedelta(seconds=value)


def _run_id(text: str) -> UUID | str:
    """A whole run id, or the hex digits of a prefix of one (``b42e2283``, as ``runs list``
    shows them); one line for anything else, before any database is opened."""
    try:
        return UUID(text)
    except ValueError:
        pass
    digits = text.strip().replace("-", "").lower()
    if not 1 <= len(digits) < 32 or any(c not in "0123456789abcdef" for c in digits):
        raise CliError(f"{text!r} is not a run id (a UUID, or the first digits of one)")
    return digits


async def _resolve(runs: AgentRuns, wanted: UUID | str) -> UUID:
    """The one run whose id starts with ``wanted``: RunNotFound for none, one line naming the
    matches for more than one."""
    if isinstance(wanted, UUID):
        return wanted
    low = UUID(wanted.ljust(32, "0"))
    high = UUID(wanted.ljust(32, "f"))
    async with runs.transaction() as tx:
        found = await runs.stores.runs.ids_between(tx, low, high, _MATCHES_SHOWN + 1)
    if not found:
        raise RunNotFound(f"no run id starts with {wanted}")
    if len(found) > 1:
        shown = ", ".join(str(run_id) for run_id in found[:_MATCHES_SHOWN])
        more = ", ..." if len(found) > _MATCHES_SHOWN else ""
        raise CliError(f"{wanted} is the start of several run ids: {shown}{more}; give more digits")
    return found[0]


_MATCHES_SHOWN = 5


@runs_app.command("show")
def runs_show(
    run_id: str,
    as_json: AsJson = False,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """A run, its epochs, its events and its failed attempts (each with its error and
    traceback)."""

    def body() -> None:
        config = settings()
        wanted = _run_id(run_id)
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url)
            shown = _using(built, lambda built: _show(built.runs(), wanted, as_json))
        if isinstance(shown, str):
            print(shown)
        else:
            out.print(shown)

    guarded(body)


async def _show(runs: AgentRuns, wanted: UUID | str, as_json: bool) -> RenderableType:
    run_id = await _resolve(runs, wanted)
    run = await runs.get(run_id)
    events = await runs.events(run_id)
    failures = await runs.failures(run_id)
    if as_json:
        return json.dumps(render.run_fields(run, events, failures), indent=2)
    return render.run(run, events, failures)


@runs_app.command("list")
def runs_list(
    state: Annotated[
        str | None,
        typer.Option(
            help="queued, leased or ended; waiting: queued runs that wait for a signal or sleep.",
            show_default="any",
        ),
    ] = None,
    reason: Annotated[
        str | None,
        typer.Option(
            help="An end reason: completed, not_retryable, retries_exhausted, ...",
            show_default="any",
        ),
    ] = None,
    kind: Annotated[str | None, typer.Option(help="A run kind.", show_default="any")] = None,
    workspace: Annotated[str | None, typer.Option(help="A workspace.", show_default="any")] = None,
    subject: Annotated[
        str | None, typer.Option(help="A subject (with --workspace).", show_default="any")
    ] = None,
    limit: Annotated[int, typer.Option(help="Runs per page (1 to 1000).")] = 50,
    cursor: Annotated[
        str | None,
        typer.Option(
            help="The next page: the cursor the previous page printed.",
            show_default="the first page",
        ),
    ] = None,
    as_json: AsJson = False,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Runs newest first, filtered by state, end reason, kind, workspace and subject, a page at a
    time; each with its last failure."""

    def body() -> None:
        config = settings()
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url)
            page = _using(
                built,
                lambda built: built.runs().list_runs(
                    workspace=workspace,
                    subject=subject,
                    kind=kind,
                    state=state,
                    reason=reason,
                    limit=limit,
                    cursor=cursor,
                ),
            )
        if as_json:
            fields = {
                "runs": [render.run_summary(run) for run in page.runs],
                "next_cursor": page.next_cursor,
            }
            print(json.dumps(fields, indent=2))
            return
        out.print(render.run_list(page.runs))
        if page.next_cursor is not None:
            err.print(f"agentruns: more runs: add --cursor {page.next_cursor}", markup=False)

    guarded(body)


@runs_app.command("cancel")
def runs_cancel(
    run_id: str,
    kinds: KindRefs = None,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """End a queued or leased run CANCELLED now; its holder stops at its next step.

    A kind with a domain row of its own needs its --kinds, so that its row moves too."""

    def body() -> None:
        config = settings()
        wanted = _run_id(run_id)
        registry = load_kinds(kinds or [])
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url, registry)
            ended = _using(built, lambda built: _cancel(built.runs(), wanted))
        out.print(f"run {ended.id} cancelled at epoch {ended.epoch}")

    guarded(body)


async def _cancel(runs: AgentRuns, wanted: UUID | str) -> AgentRun:
    run_id = await _resolve(runs, wanted)
    run = await runs.get(run_id)
    if run.state is AgentRunState.ENDED:
        raise CliError(f"run {run_id} has already ended ({run.end_reason})")
    try:
        runs.handler_of(run)
    except UnknownKind:
        raise CliError(
            f"run {run_id} is of kind {run.kind!r}, which keeps a domain row: load it with "
            "--kinds module:object so its row moves too"
        ) from None
    return await runs.cancel(run_id)


@runs_app.command("signal")
def runs_signal(
    run_id: str,
    name: str,
    payload: Annotated[
        str | None, typer.Option(help="The signal's payload, as JSON.", show_default="null")
    ] = None,
    signal_id: Annotated[
        str | None,
        typer.Option(
            "--signal-id",
            help="Deliver at most once under this id: a repeat writes nothing.",
            show_default="a new id",
        ),
    ] = None,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Deliver the signal NAME to a run: a run waiting for it is due now; one that will wait
    for it later gets it then. Refused for an ended run."""

    def body() -> None:
        config = settings()
        wanted = _run_id(run_id)
        value: object = None
        if payload is not None:
            try:
                value = json.loads(payload)
            except ValueError as error:
                raise CliError(f"--payload is not JSON: {error}") from None
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url)
            done = _using(
                built, lambda built: _signal(built.runs(), wanted, name, value, signal_id)
            )
        signal = done.signal
        if done.created:
            out.print(
                f"signal {signal.name!r} delivered to run {signal.run_id} "
                f"(signal id {signal.signal_id})",
                markup=False,
            )
        else:
            out.print(
                f"signal id {signal.signal_id} was delivered to run {signal.run_id} already, "
                "nothing new was written",
                markup=False,
            )

    guarded(body)


async def _signal(
    runs: AgentRuns, wanted: UUID | str, name: str, value: object, signal_id: str | None
) -> Delivered:
    run_id = await _resolve(runs, wanted)
    return await runs.signal(run_id, name, value, signal_id=signal_id)


@runs_app.command("retry")
def runs_retry(
    run_id: str,
    kinds: KindRefs = None,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Put a dead-lettered (or failed) run back to work: a new run continues it with one more
    attempt, refused once the kind's retry budget is spent. Prints the new run's id."""

    def body() -> None:
        config = settings()
        wanted = _run_id(run_id)
        registry = required_kinds(kinds)
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url, registry)
            ended, retried = _using(built, lambda built: _retry(built.runs(), wanted))
        print(retried.id)
        err.print(
            f"agentruns: run {ended} continues as run {retried.id} "
            f"(attempt {retried.attempt} of {registry.get(retried.kind).policy.retry_budget})",
            markup=False,
        )

    guarded(body)


async def _retry(runs: AgentRuns, wanted: UUID | str) -> tuple[UUID, AgentRun]:
    run_id = await _resolve(runs, wanted)
    return run_id, await runs.retry(run_id)


# -- purge ----------------------------------------------------------------------------------


@app.command()
def purge(
    older_than: Annotated[
        str, typer.Option(help="Delete runs that ended longer ago than this (7d, 12h, 30m).")
    ] = "7d",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing.")
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask first (a terminal is asked).")
    ] = False,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Delete ended runs (with their events and failure records) past the retention."""

    def body() -> None:
        retention = duration(older_than, "--older-than")
        config = settings()
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url)
            ask = not dry_run and not yes and is_terminal()
            if dry_run or ask:
                count = _using(built, lambda built: _purgeable(built, retention))
                if dry_run:
                    out.print(f"would purge {count} runs that ended more than {older_than} ago")
                    return
                if count == 0:
                    out.print(f"purged 0 runs: none ended more than {older_than} ago")
                    return
                if not confirm(f"Delete {count} runs that ended more than {older_than} ago?"):
                    raise CliError("nothing purged")
                built = postgres_container(config, url)
            deleted = _using(built, lambda built: built.runs().purge(retention))
        out.print(f"purged {deleted} runs that ended more than {older_than} ago")

    guarded(body)


async def _purgeable(built: AgentRunsContainer, retention: timedelta) -> int:
    async with built.stores().scope.transaction() as tx:
        count: int = await built.run_stats().ended_before(tx, retention)
        return count
