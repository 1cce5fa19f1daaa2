"""The migrations: every revision goes up, down and up again, and builds the declared schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from agentruns.adapters.postgres import admin
from agentruns.adapters.postgres.migrate import (
    MigrationChain,
    alembic_config,
    downgrade,
    migrate,
    migrations_path,
)
from agentruns.adapters.postgres.schema import metadata
from examples.review import MIGRATIONS as REVIEW
from tests.postgres_server import empty_database

# The last revision whose schema held review_job: the one before the review example moved out.
BEFORE_THE_MOVE = str(
    ScriptDirectory.from_config(alembic_config())
    .get_revision("0008_review_example_out")
    .down_revision
)


@pytest.fixture
def empty_url(postgres_server: str) -> Iterator[str]:
    with empty_database(postgres_server) as url:
        yield url


def _engine(url: str):  # type: ignore[no-untyped-def]
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def _tables(url: str) -> set[str]:
    engine = _engine(url)
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def test_the_migrations_are_found_where_the_package_looks() -> None:
    assert (migrations_path() / "versions").is_dir()


def test_every_revision_goes_up_down_and_up_again(empty_url: str) -> None:
    revisions = list(ScriptDirectory.from_config(alembic_config()).walk_revisions())
    assert revisions, "no revisions found"
    for script in reversed(revisions):  # oldest first
        migrate(empty_url, script.revision)
        downgrade(empty_url, script.down_revision or "base")
        migrate(empty_url, script.revision)
    downgrade(empty_url, "base")
    assert _tables(empty_url) <= {"alembic_version"}
    migrate(empty_url)
    tables = _tables(empty_url)
    assert {"agent_run", "agent_run_event", "agent_workspace", "agent_sandbox"} <= tables
    assert "review_job" not in tables  # the review example is a chain of its own


def test_the_migrated_schema_matches_the_metadata(empty_url: str) -> None:
    migrate(empty_url)
    engine = _engine(empty_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            differences = compare_metadata(context, metadata)
    finally:
        engine.dispose()
    # Tables of later revisions that another module declares are not this metadata's concern,
    # nor are indexes: ddl/ declares them (test_schema_files.py compares them, and more).
    ours = [
        difference
        for difference in differences
        if not (difference[0] == "remove_table" and difference[1].name not in metadata.tables)
        and difference[0] != "remove_index"
    ]
    assert ours == []


def test_a_host_chain_goes_up_down_and_up_beside_the_core_schema(empty_url: str) -> None:
    """The review example's chain keeps its own version table; agentruns' revision checks and
    upgrades neither see nor touch it."""
    migrate(empty_url)
    migrate(empty_url, chain=REVIEW)
    assert {"review_job", "review_example_version"} <= _tables(empty_url)
    current, head = admin.schema_revision(empty_url)
    assert current == head
    assert admin.upgrade(empty_url) == head  # the core upgrade is unmoved by the chain
    downgrade(empty_url, "base", chain=REVIEW)
    assert "review_job" not in _tables(empty_url)
    assert admin.schema_revision(empty_url) == (head, head)
    migrate(empty_url, chain=REVIEW)
    assert "review_job" in _tables(empty_url)


def _run_and_job(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(
            "INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, "
            "attempt, enqueued_at, due_at, lease) VALUES (gen_random_uuid(), 'review', 'acme', "
            "'s', 1, '{}', 'queued', 0, 0, now(), now(), interval '30 seconds')"
        )
        db.execute(
            "INSERT INTO review_job SELECT id, workspace, subject, 'queued', 0 FROM agent_run"
        )


def test_a_database_that_used_review_jobs_keeps_them_and_their_check(empty_url: str) -> None:
    migrate(empty_url, BEFORE_THE_MOVE)
    _run_and_job(empty_url)
    migrate(empty_url)
    migrate(empty_url, chain=REVIEW)  # adopts the table as it stands
    with psycopg.connect(empty_url, autocommit=True) as db:
        assert db.execute("SELECT status FROM review_job").fetchall() == [("queued",)]
        with pytest.raises(psycopg.errors.CheckViolation, match="review job"):
            # A legal end (guard_agent_run lets it through) that leaves its job queued.
            db.execute(
                "UPDATE agent_run SET state = 'ended', end_reason = 'cancelled', ended_at = now()"
            )


def test_a_database_that_never_used_review_jobs_loses_the_empty_table(empty_url: str) -> None:
    migrate(empty_url, BEFORE_THE_MOVE)
    assert "review_job" in _tables(empty_url)
    migrate(empty_url)
    assert "review_job" not in _tables(empty_url)
    with psycopg.connect(empty_url, autocommit=True) as db:
        functions = db.execute(
            "SELECT count(*) FROM pg_proc WHERE proname = 'review_job_run_agrees'"
        ).fetchone()
    assert functions == (0,)


def test_a_chain_is_refused_where_it_would_share_agentruns_version_table(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="agentruns' own"):
        MigrationChain(tmp_path, "alembic_version")
    with pytest.raises(ValueError, match="plain table name"):
        MigrationChain(tmp_path, "drop table x")
    with pytest.raises(ValueError, match="no folder"):
        MigrationChain(tmp_path / "missing", "host_version")


def test_workspace_subjects_split_a_shared_subject_and_recompute_heads(empty_url: str) -> None:
    """0003 turns one global subject row shared by two workspaces into one row per workspace,
    each offering its own first queued run; a subject with a leased run offers none."""
    import psycopg

    migrate(empty_url, "0002_sandboxes")
    runs = [
        # (workspace, subject, seq, state)
        ("acme", "pr:1", 1, "queued"),
        ("globex", "pr:1", 2, "queued"),
        ("acme", "pr:1", 3, "queued"),
        ("acme", "pr:2", 4, "leased"),
        ("acme", "pr:2", 5, "queued"),
    ]
    with psycopg.connect(empty_url, autocommit=True) as connection:
        for workspace, subject, seq, state in runs:
            # Rows go in queued, as the guard demands, and a claim then leases one.
            connection.execute(
                "INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, "
                "epoch, attempt, seq, enqueued_at, due_at, lease) VALUES (gen_random_uuid(), "
                "'chat', %s, %s, 1, '{}', 'queued', 0, 0, %s, now(), now(), '30 seconds')",
                (workspace, subject, seq),
            )
            if state == "leased":
                connection.execute(
                    "UPDATE agent_run SET state = 'leased', epoch = 1, holder = 'w', "
                    "leased_until = now() + interval '30 seconds' WHERE seq = %s",
                    (seq,),
                )

    migrate(empty_url, "0003_workspace_subjects")

    with psycopg.connect(empty_url) as connection:
        heads = connection.execute(
            "SELECT s.workspace, s.subject, r.seq FROM agent_subject s "
            "LEFT JOIN agent_run r ON r.id = s.head_run ORDER BY 1, 2"
        ).fetchall()
    assert heads == [("acme", "pr:1", 1), ("acme", "pr:2", None), ("globex", "pr:1", 2)]
