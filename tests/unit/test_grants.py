"""The roles' grants as text and as ``agentruns db grants`` prints them, and the one list they
come from, held to the metadata."""

from __future__ import annotations

import pytest
from sqlalchemy import Identity, Integer, Sequence
from typer.testing import CliRunner, Result

from agentruns.adapters.postgres import grants, schema
from agentruns.adapters.postgres.grants import OBJECTS, role_grants
from agentruns.domain.errors import InvalidRequest
from agentruns.entrypoints.cli import app

URL = "postgresql://ops@db.example:5432/app"


def _metadata_objects() -> set[tuple[str, str]]:
    """Every table of the metadata and every sequence behind its columns (declared, serial or
    identity), as PostgreSQL names them."""
    found = {("TABLE", name) for name in schema.metadata.tables}
    found |= {("SEQUENCE", obj.name) for obj in vars(schema).values() if isinstance(obj, Sequence)}
    for table in schema.metadata.tables.values():
        for column in table.columns:
            serial = (
                column.primary_key
                and column.autoincrement is True
                and isinstance(column.type, Integer)
            )
            if isinstance(column.identity, Identity) or serial:
                found.add(("SEQUENCE", f"{table.name}_{column.name}_seq"))
    return found


def test_every_table_and_sequence_of_the_metadata_is_in_the_role_lists() -> None:
    listed = {(item.kind, item.name) for item in OBJECTS}
    missing = _metadata_objects() - listed
    assert not missing, f"add these to agentruns.adapters.postgres.grants.OBJECTS: {missing}"


# The reader's one write: its own watchers' rows (a read-only console streams a run: ADRs/0030).
READER_WRITES = {"agent_run_watch": ("SELECT", "INSERT", "DELETE")}


def test_the_worker_writes_no_ddl_and_the_reader_only_selects() -> None:
    for item in OBJECTS:
        assert set(item.worker) <= {"SELECT", "INSERT", "UPDATE", "DELETE", "USAGE", "EXECUTE"}
        assert set(item.reader) <= {"SELECT", "INSERT", "DELETE"}
        if item.kind == "TABLE":
            assert "SELECT" in item.worker, item.name
            assert item.reader == READER_WRITES.get(item.name, ("SELECT",)), item.name
        else:
            assert set(item.reader) <= {"SELECT"}, item.name
        assert item.why, item.name
    assert len({item.name for item in OBJECTS}) == len(OBJECTS)


def test_a_worker_in_a_schema_gets_qualified_grants_defaults_and_the_role_search_path() -> None:
    made = role_grants("worker", "ar_worker", database="app", schema="agentruns")
    sql = [grant.sql for grant in made]
    assert sql[:2] == [
        'GRANT CONNECT ON DATABASE "app" TO "ar_worker"',
        'ALTER ROLE "ar_worker" SET search_path = "agentruns"',
    ]
    assert {grant.step for grant in made[:2]} == {"administrator"}
    assert {grant.step for grant in made[2:]} == {"owner"}
    assert 'GRANT USAGE ON SCHEMA "agentruns" TO "ar_worker"' in sql
    assert (
        'GRANT SELECT, INSERT, DELETE ON TABLE "agentruns".agent_workspace_delta TO "ar_worker"'
        in sql
    )
    assert 'GRANT USAGE ON SEQUENCE "agentruns".agent_run_seq TO "ar_worker"' in sql
    assert (
        'GRANT EXECUTE ON FUNCTION "agentruns".agent_claim(timestamp with time zone, interval, '
        'text, integer, boolean) TO "ar_worker"' in sql
    )
    assert (
        'ALTER DEFAULT PRIVILEGES IN SCHEMA "agentruns" GRANT SELECT, INSERT, UPDATE, DELETE '
        'ON TABLES TO "ar_worker"' in sql
    )
    assert not any("agent_run_failure_id_seq" in line or "guard_" in line for line in sql)


def test_a_reader_without_a_schema_selects_in_public_and_keeps_the_servers_search_path() -> None:
    sql = [grant.sql for grant in role_grants("reader", "ro", database="app", schema=None)]
    assert 'GRANT USAGE ON SCHEMA "public" TO "ro"' in sql
    assert 'GRANT SELECT ON TABLE agent_run TO "ro"' in sql
    assert not any(line.startswith("ALTER ROLE") for line in sql)
    assert all(
        line.startswith(("GRANT CONNECT", "GRANT USAGE ON SCHEMA", "ALTER DEFAULT"))
        or " SELECT ON TABLE " in line
        or line == 'GRANT SELECT, INSERT, DELETE ON TABLE agent_run_watch TO "ro"'
        for line in sql
    )


def test_the_owner_is_given_the_database_and_its_schema_by_an_administrator() -> None:
    assert [grant.sql for grant in role_grants("owner", "o", database="app", schema="ar")] == [
        'GRANT CONNECT ON DATABASE "app" TO "o"',
        'CREATE SCHEMA IF NOT EXISTS "ar" AUTHORIZATION "o"',
        'ALTER SCHEMA "ar" OWNER TO "o"',
        'ALTER ROLE "o" SET search_path = "ar"',
    ]
    assert [grant.sql for grant in role_grants("owner", "o", database="app", schema=None)] == [
        'GRANT CONNECT ON DATABASE "app" TO "o"',
        'GRANT USAGE, CREATE ON SCHEMA "public" TO "o"',
    ]


def test_a_role_name_is_quoted_and_a_bad_role_or_name_refused() -> None:
    [first, *_] = role_grants("reader", 'App "ro"', database="my-db", schema=None)
    assert first.sql == 'GRANT CONNECT ON DATABASE "my-db" TO "App ""ro"""'
    with pytest.raises(InvalidRequest, match="choose owner, worker, reader"):
        grants.role_named("admin")
    with pytest.raises(InvalidRequest, match="role name"):
        role_grants("reader", "", database="app", schema=None)


def test_db_grants_prints_a_script_for_psql_without_connecting() -> None:
    printed = _cli("db", "grants", "--role", "worker", "--name", "ar_worker", schema="agentruns")
    assert printed.exit_code == 0, printed.output
    lines = printed.stdout.splitlines()
    assert lines[0] == "-- agentruns: the grants of the worker role, for ar_worker"
    statements = [line for line in lines if not line.startswith("--")]
    expected = role_grants("worker", "ar_worker", database="app", schema="agentruns")
    assert statements == [f"{grant.sql};" for grant in expected]
    assert sum(line.startswith("-- as ") for line in lines) == 2
    refused = _cli("db", "grants", "--role", "admin", "--name", "x", schema=None)
    assert refused.exit_code == 1
    assert "choose owner, worker, reader" in refused.stderr


def _cli(*args: str, schema: str | None) -> Result:
    env = {"AGENTRUNS_DATABASE_URL": URL, "AGENTRUNS_SCHEMA": schema}
    return CliRunner().invoke(app, list(args), env=env)
