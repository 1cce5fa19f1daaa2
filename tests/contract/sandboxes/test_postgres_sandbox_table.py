"""The agent_sandbox table refuses, by itself, what the state table and identity forbid."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from uuid import UUID, uuid4

import psycopg
import pytest

from agentruns.adapters.postgres.connections import libpq_url
from agentruns.adapters.postgres.migrate import downgrade, migrate
from tests.contract.sandboxes.world import START
from tests.postgres_server import empty_database

pytestmark = pytest.mark.postgres


@pytest.fixture
def db(postgres_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    # The bare URL: libpq takes no agentruns_pooler parameter (a pooler tier's URL has one).
    with psycopg.connect(libpq_url(postgres_url), autocommit=True) as connection:
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


def _refused_by(db: psycopg.Connection[tuple[object, ...]], sql: str, *params: object) -> str:
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        db.execute(sql, params)
    return refused.value.diag.constraint_name or ""


def test_a_sandbox_shuts_down_after_its_request(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    """ck_agent_sandbox_shutdown: no row whose shutdown is at or before its request."""
    for shutdown in (START, START - timedelta(seconds=1)):
        sandbox_id = uuid4()
        sql = (
            "INSERT INTO agent_sandbox (id, kind, workspace, subject, state, requested_at, "
            "shutdown_at, claim_name) VALUES (%s, 'coder', 'ws', 'task:1', 'requested', %s, %s, %s)"
        )
        params = (sandbox_id, START, shutdown, f"sbx-{sandbox_id.hex}")
        assert _refused_by(db, sql, *params) == "ck_agent_sandbox_shutdown"


def test_a_sandboxs_last_use_lies_within_its_life(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    """ck_agent_sandbox_last_used: between its first call and its shutdown. A last use far in
    the future would keep the sandbox from ever idling."""
    sandbox_id = insert(db)  # first called at START, shut down at START + 1 hour
    sql = "UPDATE agent_sandbox SET last_used_at = %s WHERE id = %s"
    for used in (START + timedelta(days=365), START + timedelta(hours=1, seconds=1)):
        assert _refused_by(db, sql, used, sandbox_id) == "ck_agent_sandbox_last_used"
    assert _refused_by(db, sql, START - timedelta(minutes=1), sandbox_id) == (
        "ck_agent_sandbox_last_used"
    )
    db.execute(sql, (START + timedelta(hours=1), sandbox_id))


@pytest.mark.parametrize(
    "change",
    [
        "last_used_at = last_used_at - interval '1 second'",
        "last_used_at = NULL",
        "ready_at = ready_at + interval '1 minute'",
        "ready_at = NULL",
    ],
    ids=["used-moved-back", "use-erased", "first-call-moved", "first-call-erased"],
)
def test_a_sandboxs_first_call_and_last_use_never_move_back(
    db: psycopg.Connection[tuple[object, ...]], change: str
) -> None:
    """guard_agent_sandbox_times: the first call is kept, the last use only moves forward."""
    sandbox_id = insert(db)
    move(db, sandbox_id, "ready")
    used = START + timedelta(minutes=30)
    db.execute("UPDATE agent_sandbox SET last_used_at = %s WHERE id = %s", (used, sandbox_id))
    sql = f"UPDATE agent_sandbox SET {change} WHERE id = %s"
    assert _refused_by(db, sql, sandbox_id) == "guard_agent_sandbox_times"
    row = db.execute(
        "SELECT ready_at, last_used_at FROM agent_sandbox WHERE id = %s", (sandbox_id,)
    )
    assert row.fetchone() == (START, used)


async def test_the_sandbox_revision_downgrades_and_upgrades(postgres_server: str) -> None:
    """0002_sandboxes goes down to 0001_runs, leaving the runs, and comes back up."""
    with empty_database(postgres_server) as url:
        migrate(url, "0002_sandboxes")
        downgrade(url, "0001_runs")
        with psycopg.connect(libpq_url(url)) as connection:
            tables = {
                row[0]
                for row in connection.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                )
            }
            assert "agent_sandbox" not in tables
            assert "agent_run" in tables
        migrate(url, "0002_sandboxes")
        with psycopg.connect(libpq_url(url)) as connection:
            row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
            assert row == ("0002_sandboxes",)
            assert connection.execute("SELECT count(*) FROM agent_sandbox").fetchone() == (0,)
