"""The agent_sandbox table refuses, by itself, what the state table and identity forbid."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from uuid import UUID, uuid4

import psycopg
import pytest

from agentruns.adapters.postgres.migrate import downgrade, migrate
from tests.contract.sandboxes.world import START
from tests.postgres_server import empty_database

pytestmark = pytest.mark.postgres


@pytest.fixture
def db(postgres_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        yield connection


def insert(
    db: psycopg.Connection[tuple[object, ...]], subject: str = "task:1", state: str = "requested"
) -> UUID:
    sandbox_id = uuid4()
    db.execute(
        "INSERT INTO agent_sandbox (id, kind, workspace, subject, state, requested_at, "
        "ready_at, shutdown_at, claim_name) VALUES (%s, 'coder', 'ws', %s, %s, %s, %s, %s, %s)",
        (
            sandbox_id,
            subject,
            state,
            START,
            START,
            START + timedelta(hours=1),
            f"sbx-{sandbox_id.hex}",
        ),
    )
    return sandbox_id


def move(db: psycopg.Connection[tuple[object, ...]], sandbox_id: UUID, state: str) -> None:
    db.execute(
        "UPDATE agent_sandbox SET state = %s, ready_at = COALESCE(ready_at, %s) WHERE id = %s",
        (state, START, sandbox_id),
    )


def test_a_sandbox_is_inserted_requested(db: psycopg.Connection[tuple[object, ...]]) -> None:
    """guard_agent_sandbox refuses a row born READY or DELETING."""
    for state in ("ready", "deleting"):
        with pytest.raises(psycopg.errors.CheckViolation, match="inserted requested"):
            insert(db, state=state)


def test_the_state_table_holds_in_the_database(db: psycopg.Connection[tuple[object, ...]]) -> None:
    """REQUESTED -> READY -> DELETING is allowed; nothing goes back, DELETING never moves."""
    sandbox_id = insert(db)
    move(db, sandbox_id, "ready")
    with pytest.raises(psycopg.errors.CheckViolation, match="illegal transition"):
        move(db, sandbox_id, "requested")
    move(db, sandbox_id, "deleting")
    for state in ("requested", "ready", "deleting"):
        with pytest.raises(psycopg.errors.CheckViolation, match="illegal transition"):
            move(db, sandbox_id, state)
    db.execute("DELETE FROM agent_sandbox WHERE id = %s", (sandbox_id,))


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("subject", "task:2"),
        ("workspace", "ws-2"),
        ("kind", "talker"),
        ("claim_name", "sbx-other"),
        ("conversation", True),
        ("shutdown_at", START + timedelta(hours=9)),
        ("id", UUID(int=5)),
    ],
)
def test_a_sandbox_never_changes_its_identity(
    db: psycopg.Connection[tuple[object, ...]], column: str, value: object
) -> None:
    """Every identity column is refused a change, whatever the state."""
    sandbox_id = insert(db)
    with pytest.raises(psycopg.errors.CheckViolation, match="identity"):
        db.execute(f"UPDATE agent_sandbox SET {column} = %s WHERE id = %s", (value, sandbox_id))


def test_a_subject_has_one_live_sandbox(db: psycopg.Connection[tuple[object, ...]]) -> None:
    """uq_agent_sandbox_live_subject: a second live row is refused; a DELETING one is not."""
    first = insert(db)
    with pytest.raises(psycopg.errors.UniqueViolation, match="uq_agent_sandbox_live_subject"):
        insert(db)
    move(db, first, "deleting")
    insert(db)


async def test_the_sandbox_revision_downgrades_and_upgrades(postgres_server: str) -> None:
    """0002_sandboxes goes down to 0001_runs, leaving the runs, and comes back up."""
    with empty_database(postgres_server) as url:
        migrate(url, "0002_sandboxes")
        downgrade(url, "0001_runs")
        with psycopg.connect(url) as connection:
            tables = {
                row[0]
                for row in connection.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                )
            }
            assert "agent_sandbox" not in tables
            assert "agent_run" in tables
        migrate(url, "0002_sandboxes")
        with psycopg.connect(url) as connection:
            row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
            assert row == ("0002_sandboxes",)
            assert connection.execute("SELECT count(*) FROM agent_sandbox").fetchone() == (0,)
