"""The migrations: every revision goes up, down and up again, and builds the declared schema."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from agentruns.adapters.postgres.migrate import alembic_config, downgrade, migrate, migrations_path
from agentruns.adapters.postgres.schema import metadata
from tests.postgres_server import empty_database


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
    assert {"agent_run", "agent_run_event", "agent_workspace", "review_job"} <= _tables(empty_url)


def test_the_migrated_schema_matches_the_metadata(empty_url: str) -> None:
    migrate(empty_url)
    engine = _engine(empty_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            differences = compare_metadata(context, metadata)
    finally:
        engine.dispose()
    # Tables of later revisions that another module declares are not this metadata's concern.
    ours = [
        difference
        for difference in differences
        if not (difference[0] == "remove_table" and difference[1].name not in metadata.tables)
    ]
    assert ours == []


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
