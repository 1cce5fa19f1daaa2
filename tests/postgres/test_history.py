"""Ended runs leave the hot table (ADRs/0035): the reaper moves them to agent_run_history, every
reader still sees one run wherever it is, and raw SQL cannot put a run in both tables."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg import errors

import agentruns
from agentruns.adapters.postgres.migrate import migrate
from agentruns.testing import ManualClock
from tests.postgres_server import empty_database

START = datetime(2030, 1, 2, 3, 4, tzinfo=UTC)


async def _note(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    yield agentruns.StepEvent("noted", {"n": run.payload.get("n")})
    if run.payload.get("flaky") and run.attempt == 0:
        raise agentruns.ProviderError("overloaded", status=503)


NOTE = agentruns.RunKind(
    agentruns.RunKindPolicy(
        name="note",
        lease=timedelta(seconds=30),
        retry_budget=3,
        backoff=agentruns.Backoff(base=timedelta(seconds=1), jitter=0.0),
    ),
    _note,
)


@pytest.fixture
def db(postgres_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        yield connection


def _where(db: psycopg.Connection[tuple[object, ...]], run_id: UUID) -> list[str]:
    """The tables that hold the run."""
    rows = db.execute(
        "SELECT 'agent_run' FROM agent_run WHERE id = %(id)s "
        "UNION ALL SELECT 'agent_run_history' FROM agent_run_history WHERE id = %(id)s",
        {"id": run_id},
    ).fetchall()
    return [str(row[0]) for row in rows]


async def test_the_reaper_moves_ended_runs_and_every_reader_still_sees_them(
    postgres_url: str, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    clock = ManualClock(START)
    async with agentruns.connect(postgres_url, kinds=[NOTE], clock=clock) as client:
        done = await client.runs.enqueue("note", workspace="w", subject="s", payload={"n": 1})
        flaky = await client.runs.enqueue(
            "note", workspace="w", subject="f", payload={"flaky": True}
        )
        queued = await client.runs.enqueue("note", workspace="w", subject="s", payload={"n": 2})
        worker = client.worker(holder="h")
        assert await worker.claim_and_drive(limit=8) == 2  # the subject's second run waits
        clock.advance(timedelta(seconds=2))  # the flaky run's backoff
        assert await worker.claim_and_drive(limit=8) == 2
        cancelled = await client.runs.enqueue("note", workspace="w", subject="c", payload={})
        await client.runs.cancel(cancelled.id)
        before = {run_id: await client.runs.get(run_id) for run_id in (done.id, flaky.id)}
        events = {run_id: await client.runs.events(run_id) for run_id in before}
        failures = await client.runs.failures(flaky.id)
        assert [f.attempt for f in failures] == [0]

        report = await client.reaper().tick()

        assert report.archived == 4  # done, flaky, the subject's second run, the cancelled one
        for run_id in (done.id, flaky.id, queued.id, cancelled.id):
            assert _where(db, run_id) == ["agent_run_history"]
        for run_id, run in before.items():
            assert await client.runs.get(run_id) == run
            assert await client.runs.events(run_id) == events[run_id]
        assert await client.runs.failures(flaky.id) == failures
        with pytest.raises(agentruns.RunAlreadyEnded):  # found where it rests, not "no run"
            await client.runs.signal(done.id, "go", {})
        with pytest.raises(agentruns.IllegalTransition, match="has ended"):
            await client.runs.cancel(done.id)
        listed = await client.runs.list_runs(workspace="w", state="ended")
        assert [run.id for run in listed.runs] == [cancelled.id, queued.id, flaky.id, done.id]
        retried = await client.runs.list_runs(workspace="w", subject="s")
        assert [run.id for run in retried.runs] == [queued.id, done.id]
        again = await client.runs.continue_after(done.id, payload={"n": 3})
        assert again.continues == done.id
        assert await worker.claim_and_drive(limit=8) == 1
        assert (await client.reaper().tick()).archived == 1  # the continuation, ended too
        continued = await client.runs.continued_by(done.id)
        assert continued is not None
        assert continued.id == again.id
        assert (await client.reaper().tick()).archived == 0  # nothing more has ended


async def test_a_purge_deletes_moved_and_unmoved_runs_with_their_events_failures_and_watchers(
    postgres_url: str, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    clock = ManualClock(START)
    async with agentruns.connect(postgres_url, kinds=[NOTE], clock=clock) as client:
        runs = [
            await client.runs.enqueue(
                "note", workspace="w", subject=f"s{n}", payload={"flaky": n == 0}
            )
            for n in range(3)
        ]
        worker = client.worker(holder="h")
        await worker.claim_and_drive(limit=8)
        clock.advance(timedelta(seconds=2))
        await worker.claim_and_drive(limit=8)
        moved, unmoved = runs[0], runs[1]
        db.execute("SELECT agent_run_archive(1)")  # the first in queue order moves
        assert _where(db, moved.id) == ["agent_run_history"]
        assert _where(db, unmoved.id) == ["agent_run"]
        for run in runs:
            db.execute(
                "INSERT INTO agent_run_watch (run_id, watcher, since) VALUES (%s, %s, now())",
                (run.id, uuid4()),
            )
        clock.advance(timedelta(days=8))
        assert await client.runs.purge(timedelta(days=7), batch=2) == 3
        for run in runs:
            assert _where(db, run.id) == []
            with pytest.raises(agentruns.RunNotFound):
                await client.runs.get(run.id)
        for table in ("agent_run_event", "agent_run_failure", "agent_run_watch"):
            left = db.execute(
                f"SELECT count(*) FROM {table} WHERE run_id = ANY(%s)", ([r.id for r in runs],)
            ).fetchone()
            assert left == (0,), table


def _ended_run(db: psycopg.Connection[tuple[object, ...]]) -> UUID:
    run_id = uuid4()
    db.execute(
        "INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, "
        "attempt, enqueued_at, due_at, lease) VALUES (%s, 'chat', 'acme', %s, 1, '{}', 'queued', "
        "0, 0, now(), now(), interval '30 seconds')",
        (run_id, str(run_id)),
    )
    db.execute(
        "UPDATE agent_run SET state = 'ended', end_reason = 'cancelled', ended_at = now() "
        "WHERE id = %s",
        (run_id,),
    )
    return run_id


def test_raw_sql_cannot_rewrite_a_moved_run_or_put_a_run_in_both_tables(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    moved = _ended_run(db)
    assert db.execute("SELECT agent_run_archive(NULL)").fetchone() == (1,)
    with pytest.raises(errors.CheckViolation) as rewrite:
        db.execute("UPDATE agent_run_history SET end_reason = 'completed' WHERE id = %s", (moved,))
    assert rewrite.value.diag.constraint_name == "guard_agent_run_history"
    kept = _ended_run(db)
    with pytest.raises(errors.CheckViolation) as twin:
        db.execute(
            "INSERT INTO agent_run_history SELECT * FROM agent_run_all WHERE id = %s", (kept,)
        )
    assert twin.value.diag.constraint_name == "guard_agent_run_history"
    live = uuid4()
    with pytest.raises(errors.CheckViolation) as unended:  # only an ended run rests there
        db.execute(
            "INSERT INTO agent_run_history (id, kind, workspace, subject, band, payload, state, "
            "epoch, attempt, seq, enqueued_at, due_at, lease) VALUES (%s, 'chat', 'acme', 's', "
            "1, '{}', 'queued', 0, 0, 1, now(), now(), interval '30 seconds')",
            (live,),
        )
    assert unended.value.diag.constraint_name == "ck_agent_run_history_ended"
    assert _where(db, moved) == ["agent_run_history"]
    assert _where(db, kept) == ["agent_run"]


def test_a_host_key_to_agent_run_keeps_every_run_where_it_is(
    db: psycopg.Connection[tuple[object, ...]],
) -> None:
    """A host's foreign key would lose its rows to the move (ON DELETE CASCADE) or refuse it: the
    reaper moves nothing while one exists, and everything again once it is dropped."""
    db.execute(
        "CREATE TABLE host_row (run_id uuid PRIMARY KEY REFERENCES agent_run (id) "
        "ON DELETE CASCADE)"
    )
    run_id = _ended_run(db)
    db.execute("INSERT INTO host_row VALUES (%s)", (run_id,))
    assert db.execute("SELECT agent_run_archive(NULL)").fetchone() == (0,)
    assert _where(db, run_id) == ["agent_run"]
    assert db.execute("SELECT count(*) FROM host_row").fetchone() == (1,)
    db.execute("ALTER TABLE host_row DROP CONSTRAINT host_row_run_id_fkey")
    assert db.execute("SELECT agent_run_archive(NULL)").fetchone() == (1,)
    assert _where(db, run_id) == ["agent_run_history"]
    assert db.execute("SELECT count(*) FROM host_row").fetchone() == (1,)


@pytest.fixture
def empty_url(postgres_server: str) -> Iterator[str]:
    with empty_database(postgres_server) as url:
        yield url


_INSERT = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt,
                       enqueued_at, due_at, lease)
VALUES (%(id)s, 'note', 'w', %(subject)s, 1, '{}', 'queued', 0, 0, now(), now(),
        interval '30 seconds')
"""
_LEASE = """
UPDATE agent_run SET state = 'leased', epoch = epoch + 1, holder = 'h', claimed_at = now(),
                     leased_until = now() + interval '30 seconds'
WHERE id = %(id)s
"""
_STEP = """
WITH r AS (UPDATE agent_run SET events = events + 1 WHERE id = %(id)s
           RETURNING id, events, epoch)
INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at)
SELECT id, events, epoch, 'noted', '{"n": 1}', now() FROM r
"""
_FAIL = """
INSERT INTO agent_run_failure (run_id, epoch, attempt, holder, error_type, message,
                               failure_class, traceback, recorded_at)
SELECT id, epoch, attempt, holder, 'ProviderError', 'overloaded', 'transient', '', now()
FROM agent_run WHERE id = %(id)s
"""
_REQUEUE = """
UPDATE agent_run SET state = 'queued', attempt = attempt + 1, holder = NULL,
                     leased_until = NULL WHERE id = %(id)s
"""
_PARK = """
UPDATE agent_run SET state = 'queued', holder = NULL, leased_until = NULL, parked = true,
                     due_at = now() + interval '1 second',
                     waiting_until = now() + interval '1 second', waiting_since = now()
WHERE id = %(id)s
"""
_END = """
UPDATE agent_run SET state = 'ended', end_reason = 'completed', ended_at = now(),
                     leased_until = NULL
WHERE id = %(id)s
"""


def test_the_revision_carries_queued_leased_waiting_and_ended_runs_over(empty_url: str) -> None:
    """A database at the revision before, with runs in every state, several per subject: after
    the upgrade the ended ones are in the history with their events and failures, the others
    where they were, and the queue goes on in subject order."""
    migrate(empty_url, "0029_state_watched_per_statement")
    ids = {name: uuid4() for name in ("a1", "a2", "f", "b1", "b2", "z")}
    subjects = {"a1": "a", "a2": "a", "f": "f", "b1": "b", "b2": "b", "z": "z"}
    with psycopg.connect(empty_url, autocommit=True) as db:
        for name, run_id in ids.items():
            db.execute(_INSERT, {"id": run_id, "subject": subjects[name]})
        for name, writes in {
            "a1": (_LEASE, _STEP, _END),
            "a2": (_LEASE, _STEP, _END),  # promoted when a1 ended
            "f": (_LEASE, _FAIL, _REQUEUE, _LEASE, _STEP, _END),
            "b1": (_LEASE,),  # b2 waits behind it
            "z": (_LEASE, _PARK),
        }.items():
            for write in writes:
                db.execute(write, {"id": ids[name]})
        events = dict(
            db.execute("SELECT run_id, count(*) FROM agent_run_event GROUP BY run_id").fetchall()
        )
    migrate(empty_url)
    with psycopg.connect(empty_url, autocommit=True) as db:
        for name in ("a1", "a2", "f"):
            assert _where(db, ids[name]) == ["agent_run_history"], name
            assert db.execute(
                "SELECT count(*) FROM agent_run_event WHERE run_id = %s", (ids[name],)
            ).fetchone() == (events[ids[name]],)
        assert db.execute(
            "SELECT count(*) FROM agent_run_failure WHERE run_id = %s", (ids["f"],)
        ).fetchone() == (1,)
        for name in ("b1", "b2", "z"):
            assert _where(db, ids[name]) == ["agent_run"], name
        states = dict(db.execute("SELECT id, state FROM agent_run_all").fetchall())
        assert states == {
            ids["a1"]: "ended",
            ids["a2"]: "ended",
            ids["f"]: "ended",
            ids["b1"]: "leased",
            ids["b2"]: "queued",
            ids["z"]: "queued",
        }
        db.execute(_END, {"id": ids["b1"]})
        claimed = db.execute("SELECT id FROM agent_claim(NULL, interval '0', 'h2', 1)").fetchall()
        assert claimed == [(ids["b2"],)]  # the subject's next run, in order
        time.sleep(1.1)  # the wait's end
        woken = db.execute("SELECT id FROM agent_claim(NULL, interval '0', 'h2', 1)").fetchall()
        assert woken == [(ids["z"],)]
