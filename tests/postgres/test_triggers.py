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


FLAG = "UPDATE agent_run SET head = true WHERE id = %s"
HEADS = """
SELECT r.id::text, r.head, o.run_id IS NOT NULL AS named
FROM agent_run r LEFT JOIN agent_subject_head o
  ON o.workspace = r.workspace AND o.subject = r.subject AND o.run_id = r.id
WHERE r.subject = %s ORDER BY r.seq
"""


def _heads(db: psycopg.Connection[tuple[object, ...]], subject: str) -> list[tuple[object, ...]]:
    return db.execute(HEADS, (subject,)).fetchall()


LEASE_FLAGGED = LEASE.replace("SET ", "SET head = true, ")


def test_two_leased_runs_of_one_subject_are_refused(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    """Only a subject's head may be leased, and a subject has one head."""
    _run(db, "leased", "same")
    second = _run(db, "queued", "same")
    assert _refused(db, LEASE, second) == "ck_agent_run_head"
    for sql in (FLAG, LEASE_FLAGGED):
        with pytest.raises(errors.UniqueViolation) as refused:
            db.execute(sql, (second,))
        assert refused.value.diag.constraint_name == "uq_agent_run_head"


def test_a_head_that_ends_hands_its_subject_to_the_next_waiting_run(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    """Ended by raw SQL that never names the head, the subject still moves on in queue order: the
    next run is named on the subject's row (ADRs/0036), and its lease flags it head."""
    first = _run(db, "leased", "same")
    second = _run(db, "queued", "same")
    third = _run(db, "queued", "same")
    db.execute(END, (first,))
    assert _heads(db, "same")[1:] == [(second, False, True), (third, False, False)]
    db.execute(LEASE_FLAGGED, (second,))
    assert _heads(db, "same") == [
        (first, False, False),
        (second, True, False),
        (third, False, False),
    ]


def test_only_the_promoted_head_is_leased(db: psycopg.Connection[tuple[object, ...]]) -> None:
    """Subject FIFO holds while a head is named on the subject's row: the run after it is neither
    leased nor flagged head, and a new run of the subject waits behind it."""
    first = _run(db, "leased", "same")
    second = _run(db, "queued", "same")
    third = _run(db, "queued", "same")
    db.execute(END, (first,))
    fourth = _run(db, "queued", "same")
    for run in (third, fourth):
        assert _refused(db, LEASE, run) == "ck_agent_run_head"
        assert _refused(db, LEASE_FLAGGED, run) == "guard_agent_run_head"
        assert _refused(db, FLAG, run) == "guard_agent_run_head"
    assert _heads(db, "same") == [
        (first, False, False),
        (second, False, True),
        (third, False, False),
        (fourth, False, False),
    ]
    db.execute(FLAG, (second,))  # a raw promotion of the named head takes it, as a claim does
    assert _heads(db, "same")[1] == (second, True, False)
    with pytest.raises(errors.UniqueViolation):
        db.execute(LEASE_FLAGGED, (third,))


def test_a_promoted_head_that_ends_unclaimed_hands_its_subject_on(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    """A named head cancelled before its claim leaves its subject to the next run."""
    first = _run(db, "leased", "same")
    second = _run(db, "queued", "same")
    third = _run(db, "queued", "same")
    db.execute(END, (first,))
    db.execute(END.replace("leased_until = NULL", "leased_until = NULL, head = false"), (second,))
    assert _heads(db, "same")[1:] == [(second, False, False), (third, False, True)]
    db.execute(LEASE_FLAGGED, (third,))
    assert _heads(db, "same")[2] == (third, True, False)


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM agent_subject_head",
        "UPDATE agent_subject_head SET run_id = %(third)s",
        "UPDATE agent_subject_head SET due_at = due_at - interval '1 hour'",
        "INSERT INTO agent_subject_head (workspace, subject, run_id, band, due_at, seq) "
        "SELECT 'acme', 'other', %(third)s, 1, now(), 1",
        "TRUNCATE agent_subject_head",
    ],
)
def test_only_the_runs_triggers_name_a_subjects_head(
    db: psycopg.Connection[tuple[object, ...]], sql: str
) -> None:
    """agent_subject_head is written by agent_run's triggers alone: a writer cannot move the name
    to another run, take it away, or reorder it (ADRs/0036)."""
    first = _run(db, "leased", "same")
    second = _run(db, "queued", "same")
    third = _run(db, "queued", "same")
    db.execute(END, (first,))
    with pytest.raises(errors.CheckViolation) as refused:
        db.execute(sql, {"third": third})
    assert refused.value.diag.constraint_name == "guard_agent_subject_head"
    assert _heads(db, "same")[1] == (second, False, True)


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


def test_a_named_head_made_due_later_keeps_its_place_in_the_claims_order(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    """A merge's debounce of a promoted head (ADRs/0031) moves its subject's row with it, so the
    claim ranks it at its new due time (ADRs/0036)."""
    first = _run(db, "leased", "same")
    second = _run(db, "queued", "same")
    db.execute(END, (first,))
    db.execute("UPDATE agent_run SET due_at = due_at + interval '1 hour' WHERE id = %s", (second,))
    moved = db.execute(
        "SELECT o.due_at = r.due_at FROM agent_subject_head o JOIN agent_run r ON r.id = o.run_id"
    ).fetchall()
    assert moved == [(True,)]
