"""Commands that run agentruns: ``db`` (schema, URL, embedded server), ``worker``, ``reaper``."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from agentruns.app.metrics import sample_queue_depth
from agentruns.domain.provider_limits import parse_limits
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.cli.root import (
    DatabaseName,
    DataDir,
    KindRefs,
    SandboxesRef,
    app,
    db_app,
    out,
)
from agentruns.entrypoints.cli.schedules import start_scheduler
from agentruns.entrypoints.cli.support import (
    DEFAULT_DATA_DIR,
    CliError,
    database,
    duration,
    err,
    guarded,
    load_sandboxes,
    port,
    postgres_container,
    required_kinds,
    settings,
    stop_on_signals,
)
from agentruns.entrypoints.container import AgentRunsContainer, default_holder
from agentruns.entrypoints.settings import MAX_WORKER_CONCURRENCY

log = logging.getLogger("agentruns.cli")

# -- db -------------------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(data_dir: DataDir = None, database_name: DatabaseName = None) -> None:
    """Migrate the schema to the newest revision."""

    def body() -> None:
        config = settings()
        options = composition.connection_options(config, composition.process_name("cli"))
        with database(config, data_dir, database_name) as url:
            head = composition.upgrade_database(url, config, options=options, retrying=_retrying)
        out.print(f"database schema at revision {head} (newest)")

    guarded(body)


def _retrying(why: str) -> None:
    err.print(f"agentruns: {why}", markup=False)


@db_app.command("current")
def db_current(data_dir: DataDir = None, database_name: DatabaseName = None) -> None:
    """Show the schema's revision and the newest one; exit 1 if it is behind."""

    def body() -> None:
        config = settings()
        options = composition.connection_options(config, composition.process_name("cli"))
        with database(config, data_dir, database_name) as url:
            current, head = composition.database_revision(url, options)
        if current == head:
            out.print(f"database schema at revision {current} (newest)")
            return
        out.print(f"database schema at revision {current or 'none'}; newest is {head}")
        raise CliError("the schema is behind: run `agentruns db upgrade`")

    guarded(body)


@db_app.command("grants")
def db_grants(
    role: Annotated[
        str,
        typer.Option(
            "--role",
            help="owner (runs `db upgrade`), worker (workers, reapers, the gateway, the "
            "enqueuing application, a console that acts) or reader (a read-only console, "
            "status, reports).",
        ),
    ],
    name: Annotated[str, typer.Option("--name", help="The PostgreSQL role to grant to.")],
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Run them on the database as its URL's user (the owner, or a superuser) "
            "instead of printing them.",
        ),
    ] = False,
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Print the GRANT statements a least-privilege role needs (in AGENTRUNS_SCHEMA's schema),
    or apply them."""

    def body() -> None:
        with database(settings(), data_dir, database_name) as url:
            if not apply:
                print(composition.grant_script(url, role, name), end="")
                return
            left = composition.apply_grants(url, role, name)
        out.print(f"granted the {role} role's privileges to {name}")
        for statement in left:
            err.print(
                f"agentruns: left for an administrator (this role may not): {statement};",
                markup=False,
            )

    guarded(body)


@db_app.command("url")
def db_url(data_dir: DataDir = None, database_name: DatabaseName = None) -> None:
    """Print the database's URL (password hidden): AGENTRUNS_DATABASE_URL, or the embedded
    server's, with whether it runs and who holds it."""

    def body() -> None:
        config = settings()
        if config.database_url:
            with database(config, data_dir, database_name) as url:
                print(composition.shown_url(url))
            return
        folder = data_dir or DEFAULT_DATA_DIR
        found = composition.embedded_status(folder)
        if not found.running or found.url is None:
            raise CliError(
                f"the embedded PostgreSQL in {folder}/ is not running: `agentruns db start` "
                "starts it and keeps it running until `agentruns db stop`"
            )
        url = (
            found.url
            if database_name is None
            else composition.database_named(found.url, database_name)
        )
        print(composition.in_schema(url, config.database_schema))
        held = ", ".join(str(pid) for pid in found.holders) or "no agentruns process"
        kept = (
            "kept running until `agentruns db stop`"
            if found.kept
            else ("stops when the last agentruns process using it exits")
        )
        err.print(
            f"agentruns: the embedded PostgreSQL in {folder}/ (pid {found.pid}) is held "
            f"by {held}; it {kept}",
            markup=False,
        )

    guarded(body)


@db_app.command("start")
def db_start(data_dir: DataDir = None) -> None:
    """Start the embedded PostgreSQL (or join it) and keep it running after this command, until
    `agentruns db stop`; print its URL. For psql, or any tool, beside the commands."""

    def body() -> None:
        if settings().database_url:
            raise CliError("AGENTRUNS_DATABASE_URL is set: there is no embedded server to start")
        folder = data_dir or DEFAULT_DATA_DIR
        url = composition.keep_embedded(folder)
        print(url)
        err.print(
            f"agentruns: the embedded PostgreSQL in {folder}/ runs until `agentruns db stop`",
            markup=False,
        )

    guarded(body)


@db_app.command("stop")
def db_stop(
    data_dir: DataDir = None,
    force: Annotated[
        bool, typer.Option("--force", help="Stop it even while agentruns processes use it.")
    ] = False,
) -> None:
    """Stop the embedded PostgreSQL, whichever process started it."""

    def body() -> None:
        if settings().database_url:
            raise CliError("AGENTRUNS_DATABASE_URL is set: there is no embedded server to stop")
        folder = data_dir or DEFAULT_DATA_DIR
        found = composition.embedded_status(folder)
        if found.running and found.holders and not force:
            held = ", ".join(str(pid) for pid in found.holders)
            raise CliError(
                f"the embedded PostgreSQL in {folder}/ is in use by process(es) {held}: stop "
                "them first, or pass --force"
            )
        if composition.stop_embedded(folder):
            out.print(f"stopped the embedded PostgreSQL in {folder}/")
        else:
            out.print(f"the embedded PostgreSQL in {folder}/ was not running")

    guarded(body)


# -- worker and reaper ----------------------------------------------------------------------

MetricsPort = Annotated[
    int | None,
    typer.Option(help="Serve Prometheus metrics and /healthz on this port.", show_default="none"),
]
MetricsHost = Annotated[
    str, typer.Option(help="Address the metrics port listens on (0.0.0.0: every interface).")
]


def _with_metrics(
    built: AgentRunsContainer, port: int | None, host: str, *, worker_slots: int | None = None
) -> None:
    if port is None:
        return
    try:
        composition.serve_metrics(built, port, host, worker_slots=worker_slots)
    except OSError as exc:
        raise CliError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc


@app.command()
def worker(
    kinds: KindRefs = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            help="Runs in flight at once.", show_default="AGENTRUNS_WORKER_CONCURRENCY, 8"
        ),
    ] = None,
    holder: Annotated[
        str | None, typer.Option(help="Holder name on leases.", show_default="host:random")
    ] = None,
    drain: Annotated[
        bool,
        typer.Option(
            "--drain",
            help="Exit once no run is due and none is in flight; exit 1 if a claim failed.",
        ),
    ] = False,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = "127.0.0.1",
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Claim and run the given kinds until SIGTERM or SIGINT, then stop gracefully."""

    def body() -> None:
        config = settings()
        registry = required_kinds(kinds)
        port(metrics_port, "--metrics-port")
        if concurrency is not None:
            if not 1 <= concurrency <= MAX_WORKER_CONCURRENCY:
                raise CliError(
                    f"--concurrency {concurrency}: a worker runs from 1 to "
                    f"{MAX_WORKER_CONCURRENCY} runs at once (run more workers for more)"
                )
            # The settings size the connection pool for the worker's slots.
            config = config.model_copy(update={"worker_concurrency": concurrency})
        named = holder or default_holder()
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url, registry, process="worker", holder=named)
            _with_metrics(built, metrics_port, metrics_host, worker_slots=config.worker_concurrency)
            asyncio.run(_work(built, named, drain))

    guarded(body)


async def _work(built: AgentRunsContainer, holder: str, drain: bool) -> None:
    config = built.settings()
    running = built.worker(holder=holder, process="agentruns-worker")
    stop = asyncio.Event()
    stop_on_signals(stop)
    sampler = asyncio.create_task(
        sample_queue_depth(built.run_stats(), built.stores().scope, built.metrics(), stop, 5.0)
    )
    log.info(
        "worker started",
        extra={"holder": holder, "kinds": ",".join(built.kinds().names())},
    )
    scheduling = None
    try:
        # The settings' provider limits (AGENTRUNS_LIMITS): every worker declares them.
        for limit in parse_limits(config.limits):
            await built.runs().declare_limit(limit)
        scheduling = await start_scheduler(built, "worker", stop)
        await running.run(stop, grace=config.shutdown_grace.total_seconds(), drain=drain)
    finally:
        stop.set()
        await sampler
        if scheduling is not None:
            await scheduling
        outcomes = {str(key): value for key, value in running.stats.outcomes.items()}
        log.info(
            "worker stopped",
            extra={"holder": holder, "claimed": running.stats.claimed, **outcomes},
        )
        await composition.close(built)
    if drain and running.claim_error is not None:
        # Its claim failed (a role without a privilege, the database gone): whatever is queued
        # is still there, and a script that drains must not read that as done. The error's
        # first line says why (PostgreSQL's context lines, the statement, are in the log).
        why = str(running.claim_error).strip().splitlines() or [type(running.claim_error).__name__]
        raise CliError(
            f"--drain stopped because its claim failed, so runs may be left queued: {why[0]}"
        )


@app.command()
def reaper(
    kinds: KindRefs = None,
    sandboxes: SandboxesRef = None,
    every: Annotated[
        str | None,
        typer.Option(
            help="Time between ticks (10s, 500ms; plain numbers are seconds).",
            show_default="AGENTRUNS_LEASE_RENEWAL, 10s",
        ),
    ] = None,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = "127.0.0.1",
    data_dir: DataDir = None,
    database_name: DatabaseName = None,
) -> None:
    """Take back expired leases and end overdue runs, every tick, until SIGTERM or SIGINT; with
    --sandboxes, take back and delete the host's idle, unstarted and expired sandboxes too."""

    def body() -> None:
        config = settings()
        registry = required_kinds(kinds)
        port(metrics_port, "--metrics-port")
        tick = config.lease_renewal if every is None else duration(every, "--every")
        if tick.total_seconds() <= 0:
            raise CliError(f"--every {every}: the reaper needs a time between ticks above 0")
        hosting = load_sandboxes(sandboxes, registry) if sandboxes is not None else None
        with database(config, data_dir, database_name) as url:
            built = postgres_container(config, url, registry, hosting, process="reaper")
            _with_metrics(built, metrics_port, metrics_host)
            asyncio.run(_reap(built, tick.total_seconds(), sandboxes=hosting is not None))

    guarded(body)


async def _reap(built: AgentRunsContainer, every: float, *, sandboxes: bool) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)
    sampler = asyncio.create_task(
        sample_queue_depth(built.run_stats(), built.stores().scope, built.metrics(), stop, 5.0)
    )
    log.info("reaper started", extra={"every": every, "sandboxes": sandboxes})
    scheduling = None
    try:
        scheduling = await start_scheduler(built, "reaper", stop)
        # Both on the same tick and stop: neither needs a leader, so every replica runs both.
        async with asyncio.TaskGroup() as reapers:
            reapers.create_task(built.reaper().run(stop, every=every))
            if sandboxes:
                reapers.create_task(built.sandbox_reaper().run(stop, every=every))
    finally:
        stop.set()
        await sampler
        if scheduling is not None:
            await scheduling
        log.info("reaper stopped")
        await composition.close(built)
