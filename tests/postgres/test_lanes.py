"""The lanes the claim walks stay true to the runs, whatever concurrent writers did (ADRs/0017).

A lane (``agent_workspace``) carries its workspace's leased count and each band's first offered
head, and every change reaches it through the ledger, folded by claims that skip lanes another
claimer holds. If a fold lost a delta, a lane would count leases its workspace does not hold (the
workspace would be served late forever) or name a head that is gone (its band would go unseen).
So: several replicas claim, end, requeue, enqueue and take back at once; then one last fold, and
every lane must equal what the runs say, and the queue must drain to the last run.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import psycopg

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.postgres import PostgresDatabase, PostgresRunStore
from agentruns.app.ports import ClaimRequest, EndWrite, NewRun, TakeBack
from agentruns.domain.bands import Band
from agentruns.domain.errors import AgentRunsError
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import TerminationReason

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
WORKSPACES = 6
SUBJECTS = 40

TRUTH = """
SELECT w.id, w.leased,
       (SELECT count(*) FROM agent_run r WHERE r.workspace = w.id AND r.state = 'leased'),
       w.h0_due, w.h0_seq, w.h1_due, w.h1_seq, w.h2_due, w.h2_seq,
       b0.due_at, b0.seq, b1.due_at, b1.seq, b2.due_at, b2.seq
FROM agent_workspace w
LEFT JOIN LATERAL (SELECT due_at, seq FROM agent_run r WHERE workspace = w.id AND band = 0
    AND state = 'queued' AND NOT parked AND (head OR id IN (SELECT run_id FROM agent_subject_head))
    ORDER BY due_at, seq LIMIT 1) b0 ON true
LEFT JOIN LATERAL (SELECT due_at, seq FROM agent_run r WHERE workspace = w.id AND band = 1
    AND state = 'queued' AND NOT parked AND (head OR id IN (SELECT run_id FROM agent_subject_head))
    ORDER BY due_at, seq LIMIT 1) b1 ON true
LEFT JOIN LATERAL (SELECT due_at, seq FROM agent_run r WHERE workspace = w.id AND band = 2
    AND state = 'queued' AND NOT parked AND (head OR id IN (SELECT run_id FROM agent_subject_head))
    ORDER BY due_at, seq LIMIT 1) b2 ON true
ORDER BY w.id
"""

# Per subject with runs not ended: its head, if it is the one it must be (the leased run, or
# else the first queued run), and how many heads it has, flagged on a run or named by the
# subject's row (ADRs/0036).
HEADS = """
SELECT workspace, subject, count(*) FILTER (WHERE is_head) AS heads,
       bool_or(is_head AND (state = 'leased'
                            OR seq = (SELECT min(q.seq) FROM agent_run q
                                      WHERE q.workspace = r.workspace AND q.subject = r.subject
                                        AND q.state = 'queued'))) AS right_head
FROM (SELECT *, head OR id IN (SELECT run_id FROM agent_subject_head) AS is_head
      FROM agent_run) r
WHERE state <> 'ended'
GROUP BY workspace, subject
"""

# Every name on a subject's row is a queued run of that subject not flagged head.
NAMED = """
SELECT count(*), count(*) FILTER (WHERE r.state = 'queued' AND NOT r.head
                                   AND (r.workspace, r.subject, r.band, r.due_at, r.seq)
                                       = (o.workspace, o.subject, o.band, o.due_at, o.seq))
FROM agent_subject_head o LEFT JOIN agent_run r ON r.id = o.run_id
"""


class Replica:
    def __init__(self, url: str, clock: ManualClock) -> None:
        self.db = PostgresDatabase(url, clock, pool_size=2)
        self.runs = PostgresRunStore(self.db)


def new_run(rng: random.Random) -> NewRun:
    return NewRun(
        id=uuid4(),
        kind="chat",
        workspace=f"ws-{rng.randrange(WORKSPACES)}",
        subject=f"subject-{rng.randrange(SUBJECTS)}",
        band=rng.choice(list(Band)),
        payload={},
        lease=LEASE,
    )


async def enqueue(replica: Replica, rng: random.Random, count: int) -> None:
    async with replica.db.transaction() as tx:
        for _ in range(count):
            await replica.runs.insert(tx, new_run(rng))


async def act(replica: Replica, seed: int, rounds: int) -> None:
    """Claim a few runs at a time; end, requeue or abandon each; now and then enqueue more."""
    rng = random.Random(seed)
    for _ in range(rounds):
        if rng.random() < 0.2:
            await enqueue(replica, rng, rng.randint(1, 4))
        async with replica.db.transaction() as tx:
            claimed = await replica.runs.claim(
                tx, ClaimRequest(holder=f"h{seed}", limit=rng.randint(1, 5))
            )
        ends: list[EndWrite] = []
        for run in claimed:
            roll = rng.random()
            if roll < 0.6:
                ends.append(EndWrite(run.fence, TerminationReason.COMPLETED))
            elif roll < 0.85:
                async with replica.db.transaction() as tx:
                    await replica.runs.requeue(
                        tx, run.fence, charged=False, delay=timedelta(0), retry_budget=3
                    )
            # else abandoned: its lease runs out and a take-back gives it back
        if ends:
            async with replica.db.transaction() as tx:
                results = await replica.runs.end_many(tx, ends)
            assert not [result for result in results if isinstance(result, AgentRunsError)]


async def take_back_expired(replica: Replica) -> int:
    async with replica.db.transaction() as tx:
        expired = await replica.runs.expired(tx, 1_000)
        taken = await replica.runs.take_back_many(
            tx, [TakeBack(run.id, run.epoch, 10, timedelta(0)) for run in expired]
        )
    return len(taken)


def assert_lanes_true(url: str) -> int:
    """Check every lane and head against the runs; the number of promoted heads named."""
    with psycopg.connect(url, autocommit=True) as raw:
        raw.execute("SELECT agent_lane_fold()")
        pending = raw.execute("SELECT count(*) FROM agent_workspace_delta").fetchone()
        assert pending == (0,)
        for row in raw.execute(TRUTH).fetchall():
            workspace, leased, truly_leased, *lane = row
            assert leased == truly_leased, (
                f"{workspace} counts {leased} leases, holds {truly_leased}"
            )
            assert lane[:6] == lane[6:], f"{workspace}'s heads {lane[:6]} are not {lane[6:]}"
        for workspace, subject, heads, right in raw.execute(HEADS).fetchall():
            assert (heads, right) == (1, True), f"{workspace}/{subject}: {heads} heads"
        counted = raw.execute(NAMED).fetchone()
        assert counted is not None
        named, right_named = counted
        assert named == right_named, f"{named - right_named} names of runs that are not heads"
        return int(named)


async def test_lanes_equal_the_runs_after_concurrent_claims_ends_requeues_and_take_backs(
    postgres_url: str,
) -> None:
    clock = ManualClock(START)
    replicas = [Replica(postgres_url, clock) for _ in range(4)]
    try:
        await enqueue(replicas[0], random.Random(1), 150)
        for wave in range(3):
            await asyncio.gather(
                *(act(replica, seed=10 * wave + n, rounds=25) for n, replica in enumerate(replicas))
            )
            assert_lanes_true(postgres_url)
            clock.advance(LEASE * 2)  # the abandoned leases expire
            taken = await asyncio.gather(*(take_back_expired(replica) for replica in replicas[:2]))
            assert sum(taken) > 0
            assert_lanes_true(postgres_url)

        # Nothing is lost: the queue drains to its last run through the lanes alone.
        async with replicas[0].db.transaction() as tx:
            left: list[AgentRun] = await replicas[0].runs.claim(
                tx, ClaimRequest(holder="drain", limit=10_000)
            )
        with psycopg.connect(postgres_url, autocommit=True) as raw:
            subjects = raw.execute(
                "SELECT count(DISTINCT (workspace, subject)) FROM agent_run WHERE state <> 'ended'"
            ).fetchone()
        assert subjects is not None
        assert len(left) == subjects[0]  # one lease per subject with work, none missed
        while left:
            async with replicas[0].db.transaction() as tx:
                await replicas[0].runs.end_many(
                    tx, [EndWrite(run.fence, TerminationReason.COMPLETED) for run in left]
                )
            assert_lanes_true(postgres_url)
            async with replicas[0].db.transaction() as tx:
                left = await replicas[0].runs.claim(tx, ClaimRequest(holder="drain", limit=10_000))
        assert_lanes_true(postgres_url)
        with psycopg.connect(postgres_url, autocommit=True) as raw:
            assert raw.execute(
                "SELECT count(*) FROM agent_run WHERE state <> 'ended'"
            ).fetchone() == (0,)

        # Whatever the interleaving above left named, a head named on its subject's row is
        # checked at least once (ADRs/0036): the end of a subject's first run names its second.
        async with replicas[0].db.transaction() as tx:
            first = await replicas[0].runs.insert(tx, new_run(random.Random(2)))
            second = await replicas[0].runs.insert(tx, new_run(random.Random(2)))
        for expected in (first, second):
            async with replicas[0].db.transaction() as tx:
                claimed = await replicas[0].runs.claim(tx, ClaimRequest(holder="h", limit=10))
            assert [run.id for run in claimed] == [expected.id]
            async with replicas[0].db.transaction() as tx:
                await replicas[0].runs.end_many(
                    tx, [EndWrite(claimed[0].fence, TerminationReason.COMPLETED)]
                )
            assert assert_lanes_true(postgres_url) == (1 if expected is first else 0)
    finally:
        for replica in replicas:
            await replica.db.dispose()
