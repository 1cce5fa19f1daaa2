"""Raw SQL cannot break the rules: the triggers refuse what the state table and identity forbid."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import uuid4

import psycopg
import pytest
from psycopg import errors

RUN = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt,
                       enqueued_at, due_at, lease)
VALUES (%s, 'chat', 'acme', %s, 1, '{}', 'queued', 0, 0, now(), now(), interval '30 seconds')
"""
LEASE = "UPDATE agent_run SET state = 'leased', epoch = epoch + 1, "
LEASE += "leased_until = now() + interval '30 seconds', holder = 'w' WHERE id = %s"
END = "UPDATE agent_run SET state = 'ended', end_reason = 'completed', ended_at = now(), "
END += "leased_until = NULL WHERE id = %s"
REQUEUE = "UPDATE agent_run SET state = 'queued', leased_until = NULL, holder = NULL WHERE id = %s"


@pytest.fixture
def db(postgres_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        yield connection


def _run(db: psycopg.Connection[tuple[object, ...]], state: str, subject: str = "s") -> str:
    run_id = str(uuid4())
    db.execute(RUN, (run_id, subject))
    if state in ("leased", "ended"):
        db.execute(LEASE, (run_id,))
    if state == "ended":
        db.execute(END, (run_id,))
    return run_id


def _refused(db: psycopg.Connection[tuple[object, ...]], sql: str, *params: object) -> str:
    with pytest.raises(errors.CheckViolation) as refused:
        db.execute(sql, params)
    return refused.value.diag.constraint_name or ""


ILLEGAL = [
    ("queued", REQUEUE),  # QUEUED -> QUEUED
    ("ended", REQUEUE),  # ENDED -> QUEUED
    ("ended", LEASE),  # ENDED -> LEASED
    ("ended", END),  # ENDED -> ENDED
]


@pytest.mark.parametrize(("state", "sql"), ILLEGAL)
def test_an_illegal_transition_is_refused(
    db: psycopg.Connection[tuple[object, ...]], state: str, sql: str
) -> None:
    run_id = _run(db, state)
    assert _refused(db, sql, run_id) == "guard_agent_run"


def test_every_legal_transition_is_allowed(db: psycopg.Connection[tuple[object, ...]]) -> None:
    queued_to_ended = _run(db, "queued", "a")
    db.execute(END, (queued_to_ended,))
    leased = _run(db, "leased", "b")
    db.execute(
        "UPDATE agent_run SET leased_until = leased_until + interval '1s' WHERE id = %s", (leased,)
    )
    db.execute(REQUEUE, (leased,))
    db.execute(LEASE, (leased,))
    db.execute(END, (leased,))


@pytest.mark.parametrize(
    "change",
    ["id = gen_random_uuid()", "kind = 'other'", "workspace = 'other'", "subject = 'other'"],
)
@pytest.mark.parametrize("state", ["queued", "leased"])
def test_a_run_never_changes_its_identity(
    db: psycopg.Connection[tuple[object, ...]], change: str, state: str
) -> None:
    run_id = _run(db, state)
    assert _refused(db, f"UPDATE agent_run SET {change} WHERE id = %s", run_id) == "guard_agent_run"


def test_the_epoch_never_goes_back(db: psycopg.Connection[tuple[object, ...]]) -> None:
    run_id = _run(db, "leased")
    sql = "UPDATE agent_run SET epoch = epoch - 1 WHERE id = %s"
    assert _refused(db, sql, run_id) == "guard_agent_run_epoch"


def test_a_run_is_inserted_queued(db: psycopg.Connection[tuple[object, ...]]) -> None:
    sql = RUN.replace("'queued'", "'leased'")
    assert _refused(db, sql, str(uuid4()), "s") == "guard_agent_run"


def test_two_leased_runs_of_one_subject_are_refused(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    """Only a subject's head may be leased, and a subject has one head."""
    _run(db, "leased", "same")
    second = _run(db, "queued", "same")
    assert _refused(db, LEASE, second) == "ck_agent_run_head"
    with pytest.raises(errors.UniqueViolation) as refused:
        db.execute("UPDATE agent_run SET head = true WHERE id = %s", (second,))
    assert refused.value.diag.constraint_name == "uq_agent_run_head"


def test_a_head_that_ends_hands_its_subject_to_the_next_waiting_run(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    """Ended by raw SQL that never names the head, the subject still moves on in queue order."""
    first = _run(db, "leased", "same")
    second = _run(db, "queued", "same")
    third = _run(db, "queued", "same")
    db.execute(END, (first,))
    heads = db.execute(
        "SELECT id::text, head FROM agent_run WHERE subject = 'same' ORDER BY seq"
    ).fetchall()
    assert heads == [(first, False), (second, True), (third, False)]


JOB = (
    "INSERT INTO review_job (run_id, workspace, subject, status, attempt) "
    "VALUES (%s, 'acme', 's', %s, 0)"
)


@pytest.mark.parametrize(
    ("run_state", "job_status"),
    [("queued", "running"), ("queued", "ended"), ("leased", "queued"), ("ended", "running")],
)
def test_a_review_job_that_disagrees_with_its_run_cannot_commit(
    db: psycopg.Connection[tuple[object, ...]], run_state: str, job_status: str
) -> None:
    run_id = _run(db, run_state)
    with pytest.raises(errors.CheckViolation) as refused, db.transaction():
        db.execute(JOB, (run_id, job_status))
    assert refused.value.diag.constraint_name == "review_job_run_agrees"
    assert db.execute("SELECT count(*) FROM review_job").fetchone() == (0,)


def test_a_run_cannot_move_away_from_its_review_job(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    run_id = _run(db, "queued")
    db.execute(JOB, (run_id, "queued"))
    with pytest.raises(errors.CheckViolation), db.transaction():
        db.execute(LEASE, (run_id,))
    assert db.execute("SELECT state FROM agent_run WHERE id = %s", (run_id,)).fetchone() == (
        "queued",
    )


def test_a_job_and_its_run_that_move_together_commit(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    run_id = _run(db, "queued")
    db.execute(JOB, (run_id, "queued"))
    with db.transaction():
        db.execute(LEASE, (run_id,))
        db.execute("UPDATE review_job SET status = 'running' WHERE run_id = %s", (run_id,))
    assert db.execute("SELECT status FROM review_job WHERE run_id = %s", (run_id,)).fetchone() == (
        "running",
    )
