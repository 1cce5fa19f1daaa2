"""The schema reads as it is: the files of ``ddl/`` (with the tables' metadata) build the very
schema the migrations build, object for object, as PostgreSQL's catalogue prints it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from agentruns.adapters.postgres.migrate import migrate
from tests.postgres.catalogue import DDL, catalogue, ddl_files, declare, differences
from tests.postgres_server import empty_database


@pytest.fixture(scope="module")
def migrated(postgres_server: str) -> Iterator[str]:
    with empty_database(postgres_server) as url:
        migrate(url)
        yield url


@pytest.fixture
def empty_url(postgres_server: str) -> Iterator[str]:
    with empty_database(postgres_server) as url:
        yield url


def test_the_files_declare_the_schema_the_migrations_make(migrated: str, empty_url: str) -> None:
    declare(empty_url)
    assert differences(catalogue(migrated), catalogue(empty_url)) == []


def test_the_comparison_names_what_a_file_forgot_and_what_a_revision_forgot(
    postgres_server: str, empty_url: str, tmp_path: Path
) -> None:
    """A file that forgets a revision's change (the claim's pool, a trigger dropped from the
    file) and a revision whose change no file has (a new index) each fail the comparison, named."""
    folder = tmp_path / "ddl"
    shutil.copytree(DDL, folder)
    claim = folder / "claim.sql"
    text = claim.read_text()
    assert text.count("pool integer := p_limit + margin;") == 1
    claim.write_text(text.replace("pool integer := p_limit + margin;", "pool integer := p_limit;"))
    lanes = folder / "lanes.sql"
    trigger = (
        "CREATE TRIGGER agent_run_requeued AFTER UPDATE ON agent_run\n"
        "    FOR EACH ROW WHEN (OLD.state = 'leased' AND NEW.state = 'queued')\n"
        "    EXECUTE FUNCTION agent_run_requeued();\n"
    )
    assert lanes.read_text().count(trigger) == 1
    lanes.write_text(lanes.read_text().replace(trigger, ""))
    declare(empty_url, folder)
    with empty_database(postgres_server) as url:
        migrate(url)
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("CREATE INDEX ix_agent_run_kind ON agent_run (kind)")
        found = differences(catalogue(url), catalogue(empty_url))
    named = [line.split(":", 1)[0] for line in found]
    assert named == [
        "function agent_claim(timestamp with time zone,interval,text,integer,boolean)",
        "index ix_agent_run_kind",
        "trigger agent_run.agent_run_requeued",
    ]
    assert "pool integer := p_limit + margin;" in found[0]
    assert "made by the migrations, in no file of ddl/" in found[1]


def test_each_function_is_written_whole_in_one_file() -> None:
    """A newcomer opens one file and reads a function: no file patches another's text."""
    created: dict[str, str] = {}
    for path in ddl_files():
        text = path.read_text()
        assert "CREATE OR REPLACE" not in text, f"{path.name} replaces instead of declaring"
        for line in text.splitlines():
            if line.startswith("CREATE FUNCTION "):
                name = line.removeprefix("CREATE FUNCTION ").split("(", 1)[0]
                assert name not in created, f"{name} is in {created.get(name)} and {path.name}"
                created[name] = path.name
    assert created["agent_claim"] == "claim.sql"
    assert created["guard_agent_run"] == "guards.sql"
