"""Helpers of the PostgreSQL tier: raw rows written around the adapter, and populations."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable

import psycopg

from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState

INSERT = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt, seq,
                       enqueued_at, due_at, lease, deadline_at)
VALUES (%s, %s, %s, %s, %s, %s, 'queued', %s, %s, %s, %s, %s, %s, %s)
"""

# A claim takes the next epoch (guard_agent_run_epoch): a leased run goes in one epoch earlier.
LEASE = """
UPDATE agent_run SET state = 'leased', epoch = epoch + 1, leased_until = %s, holder = %s
WHERE id = %s
"""

END = """
UPDATE agent_run SET state = 'ended', end_reason = %s, ended_at = %s, leased_until = NULL
WHERE id = %s
"""

# Every table emptied, runs that have not ended too: past the TRUNCATE guards (ADRs/0016), as
# an administrator would, with the session's user triggers off for the statement.
RESET = """
SET session_replication_role = replica;
TRUNCATE agent_run, agent_run_history, agent_run_event, agent_run_failure, review_job,
         agent_workspace, agent_workspace_delta, agent_subject_head, agent_budget_hold,
         agent_run_watch;
SET session_replication_role = origin;
"""


def write_runs(
    connection: psycopg.Connection[tuple[object, ...]], runs: Iterable[AgentRun]
) -> None:
    """Write ``runs`` exactly as given (queue order included), through the legal transitions.

    A subject's head is the run inserted first while it has none, so the ended runs go in
    first (each ended before the next), then the leased ones (each its subject's
    head), then the queued ones: the subject's leased run is its head whatever its place in
    the queue order, as it would be had it been claimed."""
    ordered = sorted(runs, key=lambda run: (_WRITE_ORDER[run.state], run.seq))
    with connection.cursor() as cursor:
        for run in ordered:
            cursor.execute(
                INSERT,
                (
                    run.id,
                    run.kind,
                    run.workspace,
                    run.subject,
                    int(run.band),
                    json.dumps(run.payload),
                    run.epoch - 1 if run.state is AgentRunState.LEASED else run.epoch,
                    run.attempt,
                    run.seq,
                    run.enqueued_at,
                    run.due_at,
                    run.lease,
                    run.deadline_at,
                ),
            )
            if run.state is AgentRunState.LEASED:
                cursor.execute(LEASE, (run.leased_until, run.holder or "holder", run.id))
            elif run.state is AgentRunState.ENDED:
                reason = run.end_reason.value if run.end_reason else "completed"
                cursor.execute(END, (reason, run.ended_at or run.due_at, run.id))


_WRITE_ORDER = {AgentRunState.ENDED: 0, AgentRunState.LEASED: 1, AgentRunState.QUEUED: 2}


async def some_session_waits_on_a_lock(
    url: str, event: str | None = None, *, seconds: float = 30.0
) -> None:
    """Return once another session waits on a lock (of the ``event`` kind, such as
    ``advisory``, when given): the interleaving is certain, not timed. Fails the test if none
    does within ``seconds``."""
    give_up = asyncio.get_running_loop().time() + seconds
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watcher:
        while True:
            assert asyncio.get_running_loop().time() < give_up, "no session waited on a lock"
            cursor = await watcher.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = current_database() "
                "AND (%(event)s::text IS NULL OR wait_event = %(event)s::text)",
                {"event": event},
            )
            row = await cursor.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.002)
