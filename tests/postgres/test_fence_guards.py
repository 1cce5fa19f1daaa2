"""The schema enforces the fence on its own: every illegal write, by raw SQL, is refused by name.

Each row of :data:`ILLEGAL` meets a run in a given state (through legal raw writes), tries one
write that no writer of agentruns makes, and expects the constraint or trigger that refuses it;
the run, its events and its review job are unchanged afterwards. The legal raw writes around it
are accepted (the last tests), so the guards refuse exactly what they should.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg import errors

from agentruns.adapters.postgres.migrate import MigrationChain
from agentruns.testing import PostgresTestServer

pytestmark = pytest.mark.postgres

Db = psycopg.Connection[tuple[object, ...]]

INSERT = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt,
                       enqueued_at, due_at, lease)
VALUES (%(run)s, 'review', 'acme', %(subject)s, 1, '{"n": 1}', 'queued', 0, 0, now(), now(),
        interval '30 seconds')
"""
CLAIM = (
    "UPDATE agent_run SET state = 'leased', epoch = epoch + 1, holder = 'w', "
    "leased_until = now() + interval '30 seconds' WHERE id = %(run)s"
)
RENEW = "UPDATE agent_run SET leased_until = now() + interval '60 seconds' WHERE id = %(run)s"
REQUEUE = (
    "UPDATE agent_run SET state = 'queued', holder = NULL, leased_until = NULL WHERE id = %(run)s"
)
CHARGED_REQUEUE = (
    "UPDATE agent_run SET state = 'queued', attempt = attempt + 1, holder = NULL, "
    "leased_until = NULL WHERE id = %(run)s"
)
END = (
    "UPDATE agent_run SET state = 'ended', end_reason = 'completed', ended_at = now(), "
    "leased_until = NULL WHERE id = %(run)s"
)
# An append counts the event on its run and numbers it by the count, as the adapter does.
EVENT = (
    "WITH counted AS (UPDATE agent_run SET events = events + 1 WHERE id = %(run)s "
    "RETURNING id, events) "
    "INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at) "
    "SELECT id, events, {epoch}, 'step', '{{}}', now() FROM counted"
)
# An event inserted as given, its run's count untouched.
RAW_EVENT = (
    "INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at) "
    "SELECT %(run)s, {seq}, epoch, 'step', '{{}}', now() FROM agent_run WHERE id = %(run)s"
)
COUNT = "(SELECT events FROM agent_run WHERE id = %(run)s)"
COUNT_ONE_MORE = "UPDATE agent_run SET events = events + 1 WHERE id = %(run)s"
JOB = (
    "INSERT INTO review_job (run_id, workspace, subject, status, attempt) "
    "SELECT id, {workspace}, {subject}, {status}, {attempt} FROM agent_run WHERE id = %(run)s"
)
CURRENT = "(SELECT epoch FROM agent_run WHERE id = %(run)s)"
# A wait's give-back and the signal's wake-up (ADRs/0025).
PARK = (
    "UPDATE agent_run SET state = 'queued', holder = NULL, leased_until = NULL, "
    "due_at = now() + interval '1 day', waiting_for = 'approval', "
    "waiting_until = now() + interval '1 day' WHERE id = %(run)s"
)
WAKE = (
    "UPDATE agent_run SET due_at = now(), waiting_for = NULL, waiting_until = NULL "
    "WHERE id = %(run)s"
)
# A give-back whose wait's end is to come parks the run; the claim after its end offers it again
# (ADRs/0029).
PARKED = PARK.replace("SET ", "SET parked = true, ")
OFFER = "UPDATE agent_run SET parked = false WHERE id = %(run)s"


def _job(
    workspace: str = "workspace",
    subject: str = "subject",
    status: str = "'queued'",
    attempt: str = "epoch",
) -> str:
    return JOB.format(workspace=workspace, subject=subject, status=status, attempt=attempt)


# How a run is brought to the state an illegal write meets: legal writes only.
STARTS = {
    "queued": (),
    "leased": (CLAIM, EVENT.format(epoch=CURRENT)),
    "requeued": (CLAIM, CHARGED_REQUEUE),
    "leased-again": (CLAIM, CHARGED_REQUEUE, CLAIM),
    "ended": (CLAIM, EVENT.format(epoch=CURRENT), END),
    "claimed": (CLAIM,),
    # The count moved past its events (legal by itself: the next append is what it breaks).
    "counted ahead": (CLAIM, EVENT.format(epoch=CURRENT), COUNT_ONE_MORE),
    "queued-job": (_job(),),
    "waiting": (CLAIM, PARK),
    "parked": (CLAIM, PARKED),
}


@dataclass(frozen=True)
class Illegal:
    start: str
    write: str
    refused_by: str


ILLEGAL = {
    # A queued run's own writes: only a waiting run's wake-up moves it and leaves it queued.
    "queued run made due again without a wait": Illegal(
        "queued",
        WAKE.replace("due_at = now()", "due_at = now() - interval '1 hour'"),
        "guard_agent_run",
    ),
    # A merge's debounce (ADRs/0031) moves only a run never claimed, and only later.
    "requeued run made due later": Illegal(
        "requeued",
        "UPDATE agent_run SET due_at = due_at + interval '1 hour' WHERE id = %(run)s",
        "guard_agent_run",
    ),
    "queued run made due earlier": Illegal(
        "queued",
        "UPDATE agent_run SET due_at = due_at - interval '1 hour' WHERE id = %(run)s",
        "guard_agent_run",
    ),
    "queued run never claimed given a holder while made due later": Illegal(
        "queued",
        "UPDATE agent_run SET due_at = due_at + interval '1 hour', holder = 'w' WHERE id = %(run)s",
        "guard_agent_run_queued",
    ),
    "waiting run whose wait is moved, not ended": Illegal(
        "waiting",
        "UPDATE agent_run SET waiting_until = now() WHERE id = %(run)s",
        "guard_agent_run",
    ),
    "parked run leased": Illegal("parked", CLAIM, "guard_agent_run_leased"),
    "queued run parked without a give-back": Illegal(
        "queued", "UPDATE agent_run SET parked = true WHERE id = %(run)s", "guard_agent_run"
    ),
    "parked run offered with its wait's end moved": Illegal(
        "parked",
        "UPDATE agent_run SET parked = false, waiting_until = now() WHERE id = %(run)s",
        "guard_agent_run",
    ),
    "waiting run woken into a lease without a claim": Illegal(
        "waiting", WAKE.replace("SET ", "SET holder = 'w', "), "guard_agent_run_queued"
    ),
    # The epoch: a claim takes exactly the next one, and nothing else changes it.
    "claim without an epoch increment": Illegal(
        "queued",
        "UPDATE agent_run SET state = 'leased', holder = 'w', "
        "leased_until = now() + interval '30 seconds' WHERE id = %(run)s",
        "guard_agent_run_epoch",
    ),
    "claim skipping an epoch": Illegal(
        "queued", CLAIM.replace("epoch + 1", "epoch + 2"), "guard_agent_run_epoch"
    ),
    "lease, requeue, lease at one epoch": Illegal(
        "requeued",
        "UPDATE agent_run SET state = 'leased', holder = 'w2', "
        "leased_until = now() + interval '30 seconds' WHERE id = %(run)s",
        "guard_agent_run_epoch",
    ),
    "renewal that moves the epoch": Illegal(
        "leased", RENEW.replace("SET ", "SET epoch = epoch + 1, "), "guard_agent_run_epoch"
    ),
    "epoch going back": Illegal(
        "leased",
        "UPDATE agent_run SET epoch = epoch - 1 WHERE id = %(run)s",
        "guard_agent_run_epoch",
    ),
    "end that moves the epoch": Illegal(
        "leased", END.replace("SET ", "SET epoch = epoch + 1, "), "guard_agent_run_epoch"
    ),
    "requeue that moves the epoch": Illegal(
        "leased", REQUEUE.replace("SET ", "SET epoch = epoch + 1, "), "guard_agent_run_epoch"
    ),
    "cancel of a queued run that moves the epoch": Illegal(
        "queued", END.replace("SET ", "SET epoch = epoch + 1, "), "guard_agent_run_epoch"
    ),
    # The holder changes only with a claim.
    "holder change at the same epoch": Illegal(
        "leased",
        "UPDATE agent_run SET holder = 'thief' WHERE id = %(run)s",
        "guard_agent_run_holder",
    ),
    "holder change on an end": Illegal(
        "leased", END.replace("SET ", "SET holder = 'thief', "), "guard_agent_run_holder"
    ),
    # Attempts are spent only by a lease going back to the queue, one at a time.
    "attempt going backwards": Illegal(
        "leased-again",
        "UPDATE agent_run SET attempt = attempt - 1 WHERE id = %(run)s",
        "guard_agent_run_attempt",
    ),
    "attempt spent by a renewal": Illegal(
        "leased", RENEW.replace("SET ", "SET attempt = attempt + 1, "), "guard_agent_run_attempt"
    ),
    "two attempts spent by one requeue": Illegal(
        "leased",
        REQUEUE.replace("SET ", "SET attempt = attempt + 2, "),
        "guard_agent_run_attempt",
    ),
    "attempt spent by an end": Illegal(
        "leased", END.replace("SET ", "SET attempt = attempt + 1, "), "guard_agent_run_attempt"
    ),
    # An ended run: a known reason, its end time, no lease.
    "end with an unknown reason": Illegal(
        "leased", END.replace("'completed'", "'vanished'"), "guard_agent_run_reason"
    ),
    "end without ended_at": Illegal(
        "leased", END.replace("ended_at = now()", "ended_at = NULL"), "guard_agent_run_ended"
    ),
    "end keeping leased_until": Illegal(
        "leased", END.replace(", leased_until = NULL", ""), "guard_agent_run_ended"
    ),
    "end without a reason": Illegal(
        "leased", END.replace("'completed'", "NULL"), "guard_agent_run_ended"
    ),
    # A leased run has a holder and a lease; a queued one neither.
    "claim without a holder": Illegal(
        "queued", CLAIM.replace("holder = 'w'", "holder = NULL"), "guard_agent_run_leased"
    ),
    "claim without leased_until": Illegal(
        "queued",
        "UPDATE agent_run SET state = 'leased', epoch = epoch + 1, holder = 'w' WHERE id = %(run)s",
        "guard_agent_run_leased",
    ),
    "requeue keeping the holder": Illegal(
        "leased", REQUEUE.replace("holder = NULL, ", ""), "guard_agent_run_queued"
    ),
    "requeue keeping leased_until": Illegal(
        "leased", REQUEUE.replace(", leased_until = NULL", ""), "guard_agent_run_queued"
    ),
    # A queued run is only claimed or ended (QUEUED -> QUEUED is no move of the state table).
    "queued run given a holder": Illegal(
        "queued", "UPDATE agent_run SET holder = 'w' WHERE id = %(run)s", "guard_agent_run"
    ),
    "queued run given an end reason": Illegal(
        "queued",
        "UPDATE agent_run SET end_reason = 'completed' WHERE id = %(run)s",
        "guard_agent_run",
    ),
    "queued run's payload rewritten": Illegal(
        "queued",
        """UPDATE agent_run SET payload = '{"n": 2}' WHERE id = %(run)s""",
        "guard_agent_run",
    ),
    # A lease is positive.
    "run inserted with a negative lease": Illegal(
        "queued",
        INSERT.replace("interval '30 seconds'", "interval '-30 seconds'").replace(
            "%(run)s", "gen_random_uuid()"
        ),
        "guard_agent_run_lease",
    ),
    "run inserted with a zero lease": Illegal(
        "queued",
        INSERT.replace("interval '30 seconds'", "interval '0'").replace(
            "%(run)s", "gen_random_uuid()"
        ),
        "guard_agent_run_lease",
    ),
    "run inserted with a holder": Illegal(
        "queued",
        INSERT.replace("%(run)s", "gen_random_uuid()")
        .replace("lease)", "lease, holder)")
        .replace("interval '30 seconds')", "interval '30 seconds', 'w')"),
        "guard_agent_run_queued",
    ),
    # Only ended runs are deleted (retention).
    "delete of a queued run": Illegal(
        "queued", "DELETE FROM agent_run WHERE id = %(run)s", "guard_agent_run_delete"
    ),
    "delete of a leased run": Illegal(
        "leased", "DELETE FROM agent_run WHERE id = %(run)s", "guard_agent_run_delete"
    ),
    # What the holder leased stays as it was leased.
    **{
        f"{column} change on a leased run": Illegal(
            "leased",
            f"UPDATE agent_run SET {column} = {value} WHERE id = %(run)s",
            "guard_agent_run_frozen",
        )
        for column, value in (
            ("payload", """'{"n": 2}'"""),
            ("band", "0"),
            ("seq", "seq + 1000"),
            ("enqueued_at", "enqueued_at - interval '1 hour'"),
            ("lease", "interval '1 hour'"),
            ("deadline_at", "now() + interval '1 day'"),
            ("continues", "gen_random_uuid()"),
            ("enqueue_key", "'another key'"),
        )
    },
    "claim that rewrites the payload": Illegal(
        "queued",
        CLAIM.replace("SET ", """SET payload = '{"n": 2}', """),
        "guard_agent_run_frozen",
    ),
    "cancel that lowers the band": Illegal(
        "queued", END.replace("SET ", "SET band = 2, "), "guard_agent_run_frozen"
    ),
    # A result is written with the end only (ADRs/0026), and an ended run's result is final.
    "result on a leased run": Illegal(
        "leased",
        """UPDATE agent_run SET result = '{"a": 1}' WHERE id = %(run)s""",
        "guard_agent_run_result",
    ),
    "result on a requeue": Illegal(
        "leased", REQUEUE.replace("SET ", "SET result = '1', "), "guard_agent_run_result"
    ),
    "run inserted with a result": Illegal(
        "queued",
        INSERT.replace("%(run)s", "gen_random_uuid()")
        .replace("lease)", "lease, result)")
        .replace("interval '30 seconds')", "interval '30 seconds', '\"early\"')"),
        "guard_agent_run_result",
    ),
    "result rewritten on an ended run": Illegal(
        "ended", """UPDATE agent_run SET result = '"later"' WHERE id = %(run)s""", "guard_agent_run"
    ),
    # The state table and identity, as 0001 already refused them.
    "run inserted leased": Illegal(
        "queued",
        INSERT.replace("'queued'", "'leased'").replace("%(run)s", "gen_random_uuid()"),
        "guard_agent_run",
    ),
    "ended run requeued": Illegal("ended", REQUEUE, "guard_agent_run"),
    "ended run claimed": Illegal("ended", CLAIM, "guard_agent_run"),
    "workspace change": Illegal(
        "queued", "UPDATE agent_run SET workspace = 'globex' WHERE id = %(run)s", "guard_agent_run"
    ),
    # Events: appended only to a leased run at its current epoch, never rewritten or removed.
    "event of an older epoch": Illegal(
        "leased", EVENT.format(epoch=f"{CURRENT} - 1"), "guard_agent_run_event"
    ),
    "event of a later epoch": Illegal(
        "leased", EVENT.format(epoch=f"{CURRENT} + 1"), "guard_agent_run_event"
    ),
    "event appended to an ended run": Illegal(
        "ended", RAW_EVENT.format(seq=f"{COUNT} + 1"), "guard_agent_run_event"
    ),
    "event appended to a queued run": Illegal(
        "requeued", RAW_EVENT.format(seq=f"{COUNT} + 1"), "guard_agent_run_event"
    ),
    "stale event appended by a statement with a CTE": Illegal(
        "leased",
        "WITH added AS (INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at) "
        f"SELECT %(run)s, 2, {CURRENT} - 1, 'step', '{{}}', now() RETURNING seq) "
        "SELECT * FROM added",
        "guard_agent_run_event",
    ),
    # Events are numbered by their run's count: 1, 2, 3..., no 0, no gap (issue 27).
    "event numbered 0": Illegal("claimed", RAW_EVENT.format(seq="0"), "guard_agent_run_event_seq"),
    "event not counted on its run": Illegal(
        "leased", RAW_EVENT.format(seq=f"{COUNT} + 1"), "guard_agent_run_event_seq"
    ),
    "event numbered past its run's count": Illegal(
        "leased",
        EVENT.format(epoch=CURRENT).replace("SELECT id, events,", "SELECT id, events + 5,"),
        "guard_agent_run_event_seq",
    ),
    "event after a gap in the numbers": Illegal(
        "counted ahead", EVENT.format(epoch=CURRENT), "guard_agent_run_event_seq"
    ),
    "run inserted with an event count": Illegal(
        "queued",
        INSERT.replace("lease)", "lease, events)")
        .replace("interval '30 seconds')", "interval '30 seconds', 3)")
        .replace("%(run)s, 'review'", "gen_random_uuid(), 'review'"),
        "guard_agent_run_events",
    ),
    "event count set freely": Illegal(
        "leased", "UPDATE agent_run SET events = 40 WHERE id = %(run)s", "guard_agent_run_events"
    ),
    "event count lowered": Illegal(
        "leased",
        "UPDATE agent_run SET events = events - 1 WHERE id = %(run)s",
        "guard_agent_run_events",
    ),
    "event count moved on an ended run": Illegal("ended", COUNT_ONE_MORE, "guard_agent_run"),
    "event count moved by a claim": Illegal(
        "queued", CLAIM.replace("SET ", "SET events = events + 1, "), "guard_agent_run_events"
    ),
    "event count moved with a requeue": Illegal(
        "leased", REQUEUE.replace("SET ", "SET events = events + 1, "), "guard_agent_run_events"
    ),
    # TRUNCATE fires no row trigger: a statement trigger keeps the delete rules.
    "TRUNCATE of the runs": Illegal(
        "leased", "TRUNCATE agent_run CASCADE", "guard_agent_run_delete"
    ),
    "TRUNCATE of the events": Illegal(
        "leased", "TRUNCATE agent_run_event", "guard_agent_run_event"
    ),
    "stale event among good ones": Illegal(
        "leased",
        "INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at) "
        f"SELECT %(run)s, 100 + n, {CURRENT} - (n = 3)::integer, 'step', '{{}}', now() "
        "FROM generate_series(1, 5) AS n",
        "guard_agent_run_event",
    ),
    "event rewritten": Illegal(
        "leased",
        """UPDATE agent_run_event SET data = '{"forged": true}' WHERE run_id = %(run)s""",
        "guard_agent_run_event",
    ),
    "event moved to another epoch": Illegal(
        "leased",
        "UPDATE agent_run_event SET epoch = epoch + 1 WHERE run_id = %(run)s",
        "guard_agent_run_event",
    ),
    "event deleted from a leased run": Illegal(
        "leased", "DELETE FROM agent_run_event WHERE run_id = %(run)s", "guard_agent_run_event"
    ),
    # A review job agrees with its run: state, workspace, subject and attempt.
    "review job of another workspace": Illegal(
        "queued", _job(workspace="'globex'"), "review_job_run_agrees"
    ),
    "review job of another subject": Illegal(
        "queued", _job(subject="'review:other'"), "review_job_run_agrees"
    ),
    "review job at another attempt": Illegal(
        "queued", _job(attempt="epoch + 1"), "review_job_run_agrees"
    ),
    "review job running while its run waits": Illegal(
        "queued", _job(status="'running'"), "review_job_run_agrees"
    ),
    "review job moved to another workspace": Illegal(
        "queued-job",
        "UPDATE review_job SET workspace = 'globex' WHERE run_id = %(run)s",
        "review_job_run_agrees",
    ),
    "run claimed without its review job": Illegal("queued-job", CLAIM, "review_job_run_agrees"),
}


@pytest.fixture(scope="module")
def db(
    agentruns_server: PostgresTestServer, agentruns_migrations: Sequence[MigrationChain]
) -> Iterator[Db]:
    """One database for the module (with the review example's chain, as every test database):
    each case writes a run of its own, and a refused write leaves it as it was."""
    with (
        agentruns_server.database(agentruns_migrations) as url,
        psycopg.connect(url, autocommit=True) as connection,
    ):
        yield connection


def _start(db: Db, start: str) -> UUID:
    run = uuid4()
    params = {"run": run, "subject": f"review:{run}"}
    db.execute(INSERT, params)
    for write in STARTS[start]:
        db.execute(write, params)
    return run


def _snapshot(db: Db, run: UUID) -> tuple[object, ...]:
    params = {"run": run}
    return (
        db.execute("SELECT * FROM agent_run WHERE id = %(run)s", params).fetchall(),
        db.execute(
            "SELECT * FROM agent_run_event WHERE run_id = %(run)s ORDER BY seq", params
        ).fetchall(),
        db.execute("SELECT * FROM review_job WHERE run_id = %(run)s", params).fetchall(),
        db.execute("SELECT count(*) FROM agent_run").fetchall(),
        db.execute("SELECT count(*) FROM agent_run_event").fetchall(),
    )


@pytest.mark.parametrize("case", list(ILLEGAL.values()), ids=list(ILLEGAL))
def test_every_illegal_write_is_refused_by_name(db: Db, case: Illegal) -> None:
    run = _start(db, case.start)
    before = _snapshot(db, run)
    with pytest.raises(errors.CheckViolation) as refused, db.transaction():
        # In a transaction, so that the deferred review-job check runs at its commit.
        db.execute(case.write, {"run": run, "subject": f"review:{run}"})
    assert refused.value.diag.constraint_name == case.refused_by
    assert _snapshot(db, run) == before


def test_the_legal_raw_writes_are_accepted(db: Db) -> None:
    """Claim, renew, append at the current epoch, requeue (charged or not), claim again, end,
    and purge with the events: the moves the adapter makes all pass the guards."""
    run = _start(db, "queued")
    params = {"run": run}
    for write in (CLAIM, RENEW, EVENT.format(epoch=CURRENT), REQUEUE, CLAIM, CHARGED_REQUEUE):
        db.execute(write, params)
    # The end writes the run's result with it (ADRs/0026).
    for write in (CLAIM, EVENT.format(epoch=CURRENT), END.replace("SET ", "SET result = '[1]', ")):
        db.execute(write, params)
    row = db.execute(
        "SELECT epoch, attempt, holder, result FROM agent_run WHERE id = %(run)s", params
    )
    assert row.fetchone() == (3, 1, "w", [1])
    events = db.execute("SELECT seq, epoch FROM agent_run_event WHERE run_id = %(run)s", params)
    assert events.fetchall() == [(1, 1), (2, 3)]
    db.execute("DELETE FROM agent_run WHERE id = %(run)s", params)
    assert db.execute(
        "SELECT count(*) FROM agent_run_event WHERE run_id = %(run)s", params
    ).fetchone() == (0,)


def test_a_wait_and_its_wake_up_are_legal(db: Db) -> None:
    """ADRs/0025: the give-back keeps the epoch and the attempt, the wake-up is the one
    queued -> queued write besides a promotion, and the next claim takes the next epoch."""
    run = _start(db, "waiting")
    params = {"run": run}
    db.execute(WAKE, params)
    db.execute(CLAIM, params)
    row = db.execute(
        "SELECT state, epoch, attempt, waiting_until FROM agent_run WHERE id = %(run)s", params
    )
    assert row.fetchone() == ("leased", 2, 0, None)


def test_a_parked_wait_is_offered_again_and_claimed(db: Db) -> None:
    """ADRs/0029: the claim after a wait's end clears ``parked`` alone (a queued -> queued
    write), and the next claim leases the run unparked; a wake-up may clear it with the wait."""
    for offer in (OFFER, WAKE.replace("SET ", "SET parked = false, ")):
        run = _start(db, "parked")
        params = {"run": run}
        db.execute(offer, params)
        db.execute(CLAIM, params)
        row = db.execute(
            "SELECT state, epoch, attempt, parked FROM agent_run WHERE id = %(run)s", params
        )
        assert row.fetchone() == ("leased", 2, 0, False)


def test_a_debounce_of_a_run_never_claimed_is_legal(db: Db) -> None:
    """ADRs/0031: a queued run at epoch 0 is made due later; the next claim takes epoch 1."""
    run = _start(db, "queued")
    params = {"run": run}
    db.execute(
        "UPDATE agent_run SET due_at = due_at + interval '1 minute' WHERE id = %(run)s", params
    )
    db.execute(CLAIM, params)
    row = db.execute("SELECT state, epoch, attempt FROM agent_run WHERE id = %(run)s", params)
    assert row.fetchone() == ("leased", 1, 0)


def test_a_lease_moved_into_the_past_is_legal_and_fences_nothing_else(db: Db) -> None:
    """ADRs/0016 (issue 27): an operator may expire a lease now, to hand it to the reaper; the
    epoch, holder and events are untouched, and the take-back after it is legal."""
    run = _start(db, "leased")
    params = {"run": run}
    db.execute(
        "UPDATE agent_run SET leased_until = now() - interval '1 hour' WHERE id = %(run)s", params
    )
    db.execute(CHARGED_REQUEUE, params)
    row = db.execute("SELECT state, epoch, attempt FROM agent_run WHERE id = %(run)s", params)
    assert row.fetchone() == ("queued", 1, 1)


SANDBOX = (
    "INSERT INTO agent_sandbox (id, kind, workspace, subject, state, requested_at, shutdown_at, "
    "claim_name) VALUES (%(id)s, 'coder', 'ws', %(subject)s, 'requested', now(), "
    "now() + interval '1 hour', %(claim)s)"
)


def test_only_a_deleting_sandbox_row_is_deleted(db: Db) -> None:
    """A live sandbox's row owns its claim: DELETE of a requested or ready one is refused by
    name (issue 27); the reaper's delete of a deleting one passes."""
    for state in ("requested", "ready"):
        sandbox = uuid4()
        params = {"id": sandbox, "subject": f"task:{sandbox}", "claim": f"sbx-{sandbox.hex}"}
        db.execute(SANDBOX, params)
        if state == "ready":
            db.execute(
                "UPDATE agent_sandbox SET state = 'ready', ready_at = now() WHERE id = %(id)s",
                params,
            )
        with pytest.raises(errors.CheckViolation) as refused:
            db.execute("DELETE FROM agent_sandbox WHERE id = %(id)s", params)
        assert refused.value.diag.constraint_name == "guard_agent_sandbox_delete"
        db.execute("UPDATE agent_sandbox SET state = 'deleting' WHERE id = %(id)s", params)
        db.execute("DELETE FROM agent_sandbox WHERE id = %(id)s", params)
        gone = db.execute("SELECT count(*) FROM agent_sandbox WHERE id = %(id)s", params)
        assert gone.fetchone() == (0,)


def test_ended_runs_and_their_events_may_be_truncated(db: Db) -> None:
    """The TRUNCATE guards refuse only what DELETE refuses: with every run ended, both go."""
    with db.transaction():
        db.execute("SAVEPOINT before_truncate")
        db.execute("SET LOCAL session_replication_role = replica")
        db.execute("DELETE FROM agent_run WHERE state <> 'ended'")
        db.execute("SET LOCAL session_replication_role = origin")
        db.execute("TRUNCATE agent_run_event")
        db.execute("TRUNCATE agent_run CASCADE")
        assert db.execute("SELECT count(*) FROM agent_run").fetchone() == (0,)
        db.execute("ROLLBACK TO SAVEPOINT before_truncate")


def test_a_queued_run_may_be_cancelled_and_an_ended_runs_events_trimmed(db: Db) -> None:
    """QUEUED -> ENDED keeps the epoch and needs no holder; events of an ended run may go."""
    queued = _start(db, "queued")
    db.execute(END, {"run": queued})
    ended = _start(db, "ended")
    db.execute("DELETE FROM agent_run_event WHERE run_id = %(run)s", {"run": ended})
    events = db.execute(
        "SELECT count(*) FROM agent_run_event WHERE run_id = %(run)s", {"run": ended}
    )
    assert events.fetchone() == (0,)


def test_a_review_job_that_follows_its_run_commits(db: Db) -> None:
    """A job created with its run and moved with each claim and end agrees at every commit."""
    run = _start(db, "queued-job")
    params = {"run": run}
    with db.transaction():
        db.execute(CLAIM, params)
        db.execute(
            "UPDATE review_job SET status = 'running', attempt = 0 WHERE run_id = %(run)s", params
        )
    with db.transaction():
        db.execute(END, params)
        db.execute(
            "UPDATE review_job SET status = 'ended', attempt = 1 WHERE run_id = %(run)s", params
        )


def test_the_guard_calls_its_function_only_for_a_write_it_refuses(db: Db) -> None:
    """The legal moves pass on the trigger's condition alone (0012): no PL/pgSQL call per row
    written by a claim, a renewal or an end; the refusals above still name their rule."""
    run = uuid4()
    params = {"run": run, "subject": f"review:{run}"}
    with db.transaction():
        db.execute("SET LOCAL track_functions = 'all'")
        for write in (INSERT, CLAIM, RENEW, EVENT.format(epoch=CURRENT), REQUEUE, CLAIM, END):
            db.execute(write, params)
        calls = db.execute(
            "SELECT pg_stat_get_xact_function_calls('guard_agent_run()'::regprocedure), "
            "pg_stat_get_xact_function_calls('agent_run_enqueued()'::regprocedure)"
        ).fetchone()
    # The enqueue trigger beside it ran (the count works); the guard's function did not.
    assert calls == (None, 1)
