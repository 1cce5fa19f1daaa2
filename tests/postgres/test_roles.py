"""Least-privilege roles on a real server: an owner that migrates into schema ``agentruns``, a
worker role that runs workers, the reaper, the scheduler and purge, and a reader role whose
console and commands read but never write; each with the grants ``agentruns db grants`` gives
it and nothing more (not even PUBLIC's CONNECT on the database or EXECUTE on the functions)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

import httpx
import psycopg
import pytest
from sqlalchemy import make_url
from typer.testing import CliRunner, Result

import agentruns
from agentruns.adapters.postgres.grants import OBJECTS
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.cli import app
from agentruns.testing import ManualClock
from tests.postgres_server import empty_database

SCHEMA = "agentruns"
START = datetime(2030, 1, 2, 3, 4, tzinfo=UTC)


async def _note(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    yield agentruns.StepEvent("noted", {"text": run.payload.get("text", "")})
    if run.payload.get("flaky") and run.attempt == 0:
        raise agentruns.ProviderError("overloaded", status=503)
    yield agentruns.StepEvent("done", {})


NOTE = agentruns.RunKind(
    agentruns.RunKindPolicy(
        name="note",
        lease=timedelta(seconds=30),
        backoff=agentruns.Backoff(base=timedelta(seconds=1), jitter=0.0),
    ),
    _note,
)
TICKS = agentruns.Schedule(
    "minutely", kind="note", every=timedelta(minutes=1), workspace="sched", subject="t:{tick}"
)
KINDS = agentruns.RunKinds([NOTE], schedules=[TICKS])


@dataclass(frozen=True)
class Roles:
    """The URLs of one database on the test server, one per role (without the schema: the
    setting, or the role's search_path, gives it)."""

    admin: str
    owner: str
    worker: str
    reader: str


# Each role logs in with a password: a packaged server asks for one over TCP.
PASSWORD = "role-secret"


def _as(url: str, user: str) -> str:
    return make_url(url).set(username=user, password=PASSWORD).render_as_string(hide_password=False)


def invoke(url: str, *args: str) -> Result:
    """The command as ``url``'s role, in the schema; the process-wide agentruns logger that the
    command configures (onto the runner's stream) is put back after it."""
    env = {"AGENTRUNS_DATABASE_URL": url, "AGENTRUNS_SCHEMA": SCHEMA, "COLUMNS": "200"}
    logger = logging.getLogger("agentruns")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    try:
        return CliRunner().invoke(app, list(args), env=env)
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def _settings() -> agentruns.AgentRunsSettings:
    return agentruns.AgentRunsSettings(database_schema=SCHEMA)


@pytest.fixture(scope="module")
def roles(postgres_server: str) -> Iterator[Roles]:
    """Roles ``ar_owner``, ``ar_worker`` and ``ar_reader`` (LOGIN, no superuser) on a fresh
    database that PUBLIC may not even connect to, migrated by the owner and granted."""
    names = ("ar_owner", "ar_worker", "ar_reader")
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        for name in names:
            admin.execute(f"CREATE ROLE {name} LOGIN NOSUPERUSER PASSWORD '{PASSWORD}'")
            # An administrator that is no superuser (CI's, with CREATEROLE) acts for a role it
            # is a member of: creating the owner's schema, dropping what the roles own.
            admin.execute(f"GRANT {name} TO CURRENT_USER")
    try:
        with empty_database(postgres_server) as url:
            made = Roles(url, *(_as(url, name) for name in names))
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(f"REVOKE ALL ON DATABASE {make_url(url).database} FROM PUBLIC")
            admin_url = composition.in_schema(url, SCHEMA)
            assert composition.apply_grants(admin_url, "owner", "ar_owner") == []
            assert "(newest)" in ok(invoke(made.owner, "db", "upgrade"))
            with psycopg.connect(composition.in_schema(made.owner, SCHEMA)) as owner:
                owner.execute(f"REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {SCHEMA} FROM PUBLIC")
            for role, name in (("worker", "ar_worker"), ("reader", "ar_reader")):
                # The owner grants on its objects; the database and the role's search_path are
                # left to an administrator, which it is not.
                applied = invoke(
                    made.owner, "db", "grants", "--role", role, "--name", name, "--apply"
                )
                assert ok(applied).strip() == f"granted the {role} role's privileges to {name}"
                assert "left for an administrator" in applied.stderr
                assert f'GRANT CONNECT ON DATABASE "{make_url(url).database}"' in applied.stderr
                assert composition.apply_grants(admin_url, role, name) == []
            yield made
    finally:
        with psycopg.connect(postgres_server, autocommit=True) as admin:
            for name in names:
                admin.execute(f"DROP ROLE IF EXISTS {name}")


def test_the_role_lists_name_every_table_sequence_and_function_the_migrations_create(
    roles: Roles,
) -> None:
    with psycopg.connect(roles.admin) as admin:
        found = admin.execute(
            """
            SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
            UNION ALL
            SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = %(schema)s
            """,
            {"schema": SCHEMA},
        ).fetchall()
        elsewhere = admin.execute(
            "SELECT count(*) FROM pg_class WHERE relname LIKE 'agent%%' "
            "AND relnamespace = 'public'::regnamespace"
        ).fetchone()
    assert sorted(row[0] for row in found) == sorted(item.object_name for item in OBJECTS)
    assert elsewhere == (0,)  # everything, the version table included, is in the schema


async def test_workers_the_reaper_the_scheduler_and_purge_run_as_the_worker_role(
    roles: Roles,
) -> None:
    clock = ManualClock(START)
    connecting = agentruns.connect(roles.worker, kinds=KINDS, clock=clock, settings=_settings())
    async with connecting as client:
        done = [
            await client.runs.enqueue("note", workspace="w1", subject=f"s{n}", payload={"n": n})
            for n in range(3)
        ]
        flaky = await client.runs.enqueue(
            "note", workspace="w1", subject="flaky", payload={"flaky": True}
        )
        worker = client.worker(holder="w")
        assert await worker.claim_and_drive(limit=8) == 4
        clock.advance(timedelta(seconds=2))  # the flaky run's backoff
        assert await worker.claim_and_drive(limit=8) == 1
        for run_id in (*(run.id for run in done), flaky.id):
            assert (
                await client.runs.get(run_id)
            ).end_reason is agentruns.TerminationReason.COMPLETED
        assert [failure.attempt for failure in await client.runs.failures(flaky.id)] == [0]

        # A holder that went away: the reaper takes its lease back once it has expired.
        lost = await client.runs.enqueue("note", workspace="w2", subject="lost", payload={})
        assert [run.id for run in await client.runs.claim("gone", kinds=["note"])] == [lost.id]
        clock.advance(timedelta(seconds=31))
        assert (await client.reaper().tick()).taken_back == 1
        assert (await client.runs.get(lost.id)).state is agentruns.AgentRunState.QUEUED

        # Schedules sync and tick; workspaces and budgets change hands.
        await client.schedules.sync()
        clock.advance(timedelta(minutes=1))  # past the first tick
        assert len((await client.scheduler().tick()).enqueued) == 1
        await client.runs.hold_budget(
            agentruns.BudgetHold("w2", until=clock.now() + timedelta(hours=1))
        )
        await client.runs.release_budget("w2")
        await client.runs.set_workspace_active("w3", False)
        cancelled = await client.runs.cancel(lost.id)
        assert cancelled.end_reason is agentruns.TerminationReason.CANCELLED

        # Purge deletes the ended runs, their events with them (a trigger, as the worker).
        clock.advance(timedelta(days=8))
        assert await client.runs.purge(timedelta(days=7)) >= 5
        with pytest.raises(agentruns.RunNotFound):
            await client.runs.get(flaky.id)


@pytest.fixture(scope="module")
def queued(roles: Roles) -> UUID:
    """Two runs the worker role enqueued with the commands, one drained by `agentruns worker`
    and one not due yet; the queued one's id."""
    kinds = ("--kinds", f"{__name__}:KINDS")
    done = ok(invoke(roles.worker, "enqueue", "note", *kinds, "--subject", "done")).strip()
    waiting = ok(
        invoke(roles.worker, "enqueue", "note", *kinds, "--subject", "read", "--due", "1h")
    )
    ok(invoke(roles.worker, "worker", *kinds, "--drain"))
    shown = json.loads(ok(invoke(roles.reader, "runs", "show", done, "--json")))
    assert (shown["state"], shown["end_reason"]) == ("ended", "completed")
    return UUID(waiting.strip())


def test_the_reader_commands_read_and_a_cancel_is_refused_in_one_line(
    roles: Roles, queued: UUID
) -> None:
    assert "queued" in ok(invoke(roles.reader, "status"))
    listed = ok(invoke(roles.reader, "runs", "list", "--state", "queued"))
    assert str(queued) in listed
    ok(invoke(roles.reader, "runs", "show", str(queued)))
    refused = invoke(roles.reader, "runs", "cancel", str(queued))
    assert refused.exit_code == 1
    [line] = refused.stderr.splitlines()
    assert "permission denied for table agent_run" in line
    assert "agentruns db grants" in line


async def test_the_read_only_console_answers_as_the_reader_which_may_not_write(
    roles: Roles, queued: UUID
) -> None:
    async with agentruns.connect(roles.reader, kinds=KINDS, settings=_settings()) as reader:
        console = agentruns.create_console(reader, read_only=True)
        transport = httpx.ASGITransport(app=console)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            for path in (
                "/",
                "/live/overview",
                "/workspaces",
                "/runs",
                "/runs?state=queued&workspace=default",
                f"/runs/{queued}",
                "/schedules",
                "/sandboxes",
            ):
                answer = await http.get(path)
                assert answer.status_code == 200, (path, answer.text[:500])
        with pytest.raises(agentruns.StoreUnavailable, match="permission denied for table"):
            await reader.runs.cancel(queued)
        assert (await reader.runs.get(queued)).state is agentruns.AgentRunState.QUEUED


def test_without_the_startup_option_the_role_setting_names_the_schema(roles: Roles) -> None:
    """The transaction pooler's way: no ``options`` in the URL, the role's own search_path."""
    for url in (roles.worker, roles.reader):
        with psycopg.connect(url) as connection:
            assert connection.execute("SHOW search_path").fetchone() == (SCHEMA,)
            assert connection.execute("SELECT count(*) >= 0 FROM agent_run").fetchone() == (True,)


def test_an_owner_creates_its_schema_given_create_on_the_database(
    roles: Roles, postgres_server: str
) -> None:
    with empty_database(postgres_server) as url:
        database = make_url(url).database
        owner = _as(url, "ar_owner")
        refused = invoke(owner, "db", "upgrade")
        assert refused.exit_code == 1
        assert "permission denied for database" in refused.stderr
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"GRANT CREATE ON DATABASE {database} TO ar_owner")
        ok(invoke(owner, "db", "upgrade"))
        assert "(newest)" in ok(invoke(owner, "db", "current"))
        with psycopg.connect(url) as admin:
            found = admin.execute(
                "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %s", (SCHEMA,)
            ).fetchone()
        assert found == ("ar_owner",)
