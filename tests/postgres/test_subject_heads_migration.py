"""Revision 0031 (ADRs/0036) over a queue in use: the heads an earlier revision flagged stay heads,
the next ends promote through agent_subject_head, and claims keep subject FIFO; its downgrade
flags the promoted heads on their runs again."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import uuid4

import psycopg
import pytest

from agentruns.adapters.postgres.migrate import downgrade, migrate
from tests.postgres_server import empty_database

BEFORE = "0030_run_history"
REVISION = "0031_subject_heads"

Connection = psycopg.Connection[tuple[object, ...]]

RUN = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt,
                       enqueued_at, due_at, lease)
VALUES (%s, 'chat', 'acme', %s, 1, '{}', 'queued', 0, 0, now() - interval '1 hour',
        now() - interval '1 hour', interval '30 seconds')
"""
LEASE = """
UPDATE agent_run SET state = 'leased', epoch = epoch + 1, holder = 'old',
                     leased_until = now() + interval '30 seconds'
WHERE id = %s
"""
END = """
UPDATE agent_run SET state = 'ended', head = false, end_reason = 'completed', ended_at = now(),
                     leased_until = NULL
WHERE id = %s
"""
# A wait's give-back at revision 0029 (ADRs/0029): queued again, parked until an hour from now.
PARK = """
UPDATE agent_run SET state = 'queued', leased_until = NULL, holder = NULL, parked = true,
                     due_at = now() + interval '1 hour', waiting_for = 'approval',
                     waiting_until = now() + interval '1 hour', waiting_since = now()
WHERE id = %s
"""
WAKE = """
UPDATE agent_run SET due_at = now(), waiting_for = NULL, waiting_until = NULL,
                     waiting_since = NULL, parked = false
WHERE id = %s
"""
CLAIM = "SELECT id::text FROM agent_claim(NULL, interval '10 minutes', 'new', 100)"


@pytest.fixture
def empty_url(postgres_server: str) -> Iterator[str]:
    with empty_database(postgres_server) as url:
        yield url


def _runs(connection: Connection, subject: str, count: int) -> list[str]:
    ids = [str(uuid4()) for _ in range(count)]
    for run_id in ids:
        connection.execute(RUN, (run_id, subject))
    return ids


def _claimed(connection: Connection) -> set[str]:
    return {str(row[0]) for row in connection.execute(CLAIM).fetchall()}


def _named(connection: Connection) -> set[str]:
    return {str(row[0]) for row in connection.execute("SELECT run_id FROM agent_subject_head")}


def _queue_in_use(connection: Connection) -> dict[str, list[str]]:
    """Runs of four subjects at revision 0029, several each: a leased head, a head promoted by an
    end (flagged, as 0029 promoted), a parked wait, and a queued head never claimed."""
    runs = {subject: _runs(connection, subject, 3) for subject in ("leased", "promoted", "parked")}
    runs["queued"] = _runs(connection, "queued", 2)
    connection.execute(LEASE, (runs["leased"][0],))
    connection.execute(LEASE, (runs["promoted"][0],))
    connection.execute(END, (runs["promoted"][0],))
    connection.execute(LEASE, (runs["parked"][0],))
    connection.execute(PARK, (runs["parked"][0],))
    return runs


def test_claims_keep_subject_fifo_across_the_upgrade(empty_url: str) -> None:
    migrate(empty_url, BEFORE)
    with psycopg.connect(empty_url, autocommit=True) as connection:
        runs = _queue_in_use(connection)
        flagged = connection.execute("SELECT id::text FROM agent_run WHERE head").fetchall()

    migrate(empty_url, REVISION)

    with psycopg.connect(empty_url, autocommit=True) as connection:
        # Nothing moved: the flagged heads are heads, no head is named yet.
        assert connection.execute("SELECT id::text FROM agent_run WHERE head").fetchall() == (
            flagged
        )
        assert _named(connection) == set()
        # The offered heads are claimed (the parked wait is not due, the leased head is held).
        assert _claimed(connection) == {runs["promoted"][1], runs["queued"][0]}
        assert _claimed(connection) == set()
        # Each end promotes its subject's next run by name, and the next claim takes it.
        for subject, held in (("leased", 0), ("promoted", 1), ("queued", 0)):
            connection.execute(END, (runs[subject][held],))
            after = runs[subject][held + 1]
            assert _named(connection) == {after}
            assert _claimed(connection) == {after}
            assert _named(connection) == set()
        # The wait that was parked before the upgrade wakes, is claimed and hands on in order.
        connection.execute(WAKE, (runs["parked"][0],))
        assert _claimed(connection) == {runs["parked"][0]}
        for first, second in zip(runs["parked"], runs["parked"][1:], strict=False):
            connection.execute(END, (first,))
            assert _claimed(connection) == {second}
        left = connection.execute(
            "SELECT subject, count(*) FROM agent_run WHERE state = 'leased' GROUP BY subject "
            "ORDER BY subject"
        ).fetchall()
        assert left == [("leased", 1), ("parked", 1), ("promoted", 1), ("queued", 1)]


def test_the_downgrade_flags_the_named_heads_on_their_runs(empty_url: str) -> None:
    migrate(empty_url, REVISION)
    with psycopg.connect(empty_url, autocommit=True) as connection:
        first, second, third = _runs(connection, "s", 3)
        assert _claimed(connection) == {first}
        connection.execute(END, (first,))
        assert _named(connection) == {second}

    downgrade(empty_url, BEFORE)

    with psycopg.connect(empty_url, autocommit=True) as connection:
        heads = connection.execute(
            "SELECT id::text, head FROM agent_run WHERE state = 'queued' ORDER BY seq"
        ).fetchall()
        assert heads == [(second, True), (third, False)]
        assert _claimed(connection) == {second}
        connection.execute(END, (second,))
        assert _claimed(connection) == {third}
