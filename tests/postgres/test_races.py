"""Races only a real server shows: concurrent claimers, a renewal racing the reaper, a zombie."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import psycopg
import pytest

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.postgres import PostgresDatabase, PostgresEventLog, PostgresRunStore
from agentruns.app.ports import ClaimRequest, NewRun, TakeBack, Transaction
from agentruns.domain.bands import Band
from agentruns.domain.errors import LeaseLost
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from tests.postgres.helpers import some_session_waits_on_a_lock

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)


class Side:
    """One replica or holder: its own engine and pinned clock on the shared database."""

    def __init__(self, url: str, clock: ManualClock) -> None:
        self.clock = clock
        self.db = PostgresDatabase(url, clock, pool_size=2)
        self.runs = PostgresRunStore(self.db)
        self.events = PostgresEventLog(self.db, self.runs)


SideMaker = Callable[[ManualClock], Side]


@pytest.fixture
async def side(postgres_url: str) -> AsyncIterator[SideMaker]:
    made: list[Side] = []

    def make(clock: ManualClock) -> Side:
        made.append(Side(postgres_url, clock))
        return made[-1]

    yield make
    for each in made:
        await each.db.dispose()


async def enqueue(
    side: Side, subject: str, workspace: str = "acme", band: Band = Band.BATCH
) -> AgentRun:
    async with side.db.transaction() as tx:
        return await side.runs.insert(
            tx,
            NewRun(
                id=uuid4(),
                kind="chat",
                workspace=workspace,
                subject=subject,
                band=band,
                payload={},
                lease=LEASE,
            ),
        )


async def claim_one(side: Side, holder: str = "w") -> AgentRun:
    async with side.db.transaction() as tx:
        [run] = await side.runs.claim(tx, ClaimRequest(holder=holder))
    return run


async def test_concurrent_claimers_take_every_due_run_exactly_once_one_per_subject(
    side: SideMaker,
) -> None:
    clock = ManualClock(START)
    setup = side(clock)
    rng = random.Random(11)
    enqueued = [
        await enqueue(
            setup, f"s-{rng.randrange(25)}", f"ws-{rng.randrange(4)}", Band(rng.randrange(3))
        )
        for _ in range(120)
    ]
    claims: list[tuple[UUID, int, tuple[str, str]]] = []
    leased_now: dict[tuple[str, str], UUID] = {}
    violations: list[str] = []

    async def claimer(name: str, mine: Side) -> None:
        while len(claims) < len(enqueued):
            async with mine.db.transaction() as tx:
                batch = await mine.runs.claim(
                    tx, ClaimRequest(holder=name, limit=rng.randint(1, 3))
                )
            for run in batch:
                key = (run.workspace, run.subject)
                if key in leased_now:
                    violations.append(f"{key} leased twice at once")
                leased_now[key] = run.id
                claims.append((run.id, run.epoch, key))
            await asyncio.sleep(0)  # let the other claimers run while these are held
            for run in batch:
                del leased_now[(run.workspace, run.subject)]
                async with mine.db.transaction() as tx:
                    await mine.runs.end(tx, run.id, TerminationReason.COMPLETED, run.fence)

    claimers = [side(clock) for _ in range(4)]
    async with asyncio.timeout(120):  # a safety net against a hang, not an assertion
        await asyncio.gather(*(claimer(f"w{i}", mine) for i, mine in enumerate(claimers)))

    assert violations == []
    assert sorted(run_id for run_id, _, _ in claims) == sorted(run.id for run in enqueued)
    assert len(set(claims)) == len(claims)
    by_subject: defaultdict[tuple[str, str], list[UUID]] = defaultdict(list)
    for run_id, _, key in claims:
        by_subject[key].append(run_id)
    for key, claimed in by_subject.items():
        assert claimed == [run.id for run in enqueued if (run.workspace, run.subject) == key], key


async def test_a_renewal_that_commits_first_wins_and_the_take_back_writes_nothing(
    side: SideMaker, postgres_url: str
) -> None:
    holder = side(ManualClock(START))
    run = await enqueue(holder, "s")
    leased = await claim_one(holder)
    holder.clock.advance(LEASE - timedelta(seconds=1))  # the holder still holds its lease
    reaper = side(ManualClock(START + LEASE + timedelta(seconds=1)))  # the reaper sees it expired

    async with holder.db.transaction() as renewal:
        await holder.runs.renew(renewal, leased.fence)
        take_back = asyncio.create_task(_take_back(reaper, leased))
        await some_session_waits_on_a_lock(postgres_url)
    assert await take_back is None
    async with holder.db.transaction() as tx:
        after = await holder.runs.get(tx, run.id)
    assert after is not None
    assert (after.state, after.epoch, after.attempt) == (AgentRunState.LEASED, 1, 0)


async def test_a_take_back_that_commits_first_wins_and_the_renewal_is_refused(
    side: SideMaker, postgres_url: str
) -> None:
    holder = side(ManualClock(START))
    run = await enqueue(holder, "s")
    leased = await claim_one(holder)
    holder.clock.advance(LEASE - timedelta(seconds=1))
    reaper = side(ManualClock(START + LEASE + timedelta(seconds=1)))

    async with reaper.db.transaction() as tx:
        assert await reaper.runs.lock(tx, run.id) is not None
        taken = await reaper.runs.take_back(
            tx, TakeBack(run.id, leased.epoch, retry_budget=3, delay=timedelta(0))
        )
        renewal = asyncio.create_task(_renew(holder, leased))
        await some_session_waits_on_a_lock(postgres_url)
    assert taken is not None
    assert taken.state is AgentRunState.QUEUED
    with pytest.raises(LeaseLost):
        await renewal


async def test_renewals_racing_the_reaper_never_both_win(side: SideMaker) -> None:
    holder = side(ManualClock(START))
    reaper = side(ManualClock(START + LEASE + timedelta(seconds=1)))
    wins = {"renewal": 0, "reaper": 0}
    for round_ in range(30):
        await enqueue(holder, f"s-{round_}")
        leased = await claim_one(holder)
        reaper.clock.set(max(reaper.clock.now(), holder.clock.now() + LEASE + timedelta(seconds=1)))
        holder.clock.advance(LEASE - timedelta(seconds=1))
        renewed, taken = await asyncio.gather(
            _renew(holder, leased), _take_back(reaper, leased), return_exceptions=True
        )
        renewal_won = isinstance(renewed, AgentRun)
        reaper_won = isinstance(taken, AgentRun)
        assert renewal_won != reaper_won, (renewed, taken)
        if not renewal_won:
            assert isinstance(renewed, LeaseLost)
        wins["renewal" if renewal_won else "reaper"] += 1
        async with holder.db.transaction() as tx:
            after = await holder.runs.get(tx, leased.id)
        assert after is not None
        expected = AgentRunState.LEASED if renewal_won else AgentRunState.QUEUED
        assert after.state is expected
        async with holder.db.transaction() as tx:
            await holder.runs.end(tx, leased.id, TerminationReason.CANCELLED, None)
        holder.clock.advance(timedelta(minutes=5))
    assert sum(wins.values()) == 30


async def test_a_zombie_holder_has_every_write_refused_and_appends_no_event(
    side: SideMaker, postgres_url: str
) -> None:
    holder = side(ManualClock(START))
    run = await enqueue(holder, "s")
    zombie = await claim_one(holder, "zombie")
    async with holder.db.transaction() as tx:
        await holder.events.append(tx, zombie.fence, "step", {"n": 1})
    holder.clock.advance(LEASE + timedelta(seconds=1))
    async with holder.db.transaction() as tx:
        await holder.runs.take_back(tx, TakeBack(run.id, zombie.epoch, 3, timedelta(0)))
    successor = await claim_one(holder, "successor")
    assert successor.epoch == zombie.epoch + 1

    async def refused(write: Callable[[Transaction], Awaitable[object]]) -> None:
        with pytest.raises(LeaseLost):
            async with holder.db.transaction() as tx:
                await write(tx)

    fence = zombie.fence
    await refused(lambda tx: holder.runs.require_current(tx, fence))
    await refused(lambda tx: holder.runs.renew(tx, fence))
    await refused(lambda tx: holder.runs.end(tx, run.id, TerminationReason.COMPLETED, fence))
    await refused(
        lambda tx: holder.runs.requeue(tx, fence, charged=True, delay=timedelta(0), retry_budget=3)
    )
    await refused(lambda tx: holder.events.append(tx, fence, "step", {"n": 2}))
    await refused(lambda tx: holder.events.renew_and_append(tx, fence, "step", {"n": 3}))

    async with await psycopg.AsyncConnection.connect(postgres_url) as raw:
        cursor = await raw.execute(
            "SELECT epoch, count(*) FROM agent_run_event WHERE run_id = %s GROUP BY epoch",
            (run.id,),
        )
        assert await cursor.fetchall() == [(zombie.epoch, 1)]
        cursor = await raw.execute(
            "SELECT state, epoch, holder FROM agent_run WHERE id = %s", (run.id,)
        )
        assert await cursor.fetchone() == ("leased", successor.epoch, "successor")


async def test_a_step_boundary_that_waited_for_another_append_numbers_its_event_after_it(
    side: SideMaker, postgres_url: str
) -> None:
    """Two boundaries of one run at once: the second waits for the first's lock, and its
    event still takes the next number, though the first committed after its snapshot."""
    holder = side(ManualClock(START))
    run = await enqueue(holder, "s")
    leased = await claim_one(holder)
    async with holder.db.transaction() as first:
        await holder.events.renew_and_append(first, leased.fence, "step", {"n": 1})

        async def second() -> int:
            async with holder.db.transaction() as tx:
                event = await holder.events.renew_and_append(tx, leased.fence, "step", {"n": 2})
            return event.seq

        waiting = asyncio.create_task(second())
        await some_session_waits_on_a_lock(postgres_url)
    assert await waiting == 2
    async with holder.db.transaction() as tx:
        events = await holder.events.list(tx, run.id)
    assert [(event.seq, event.data) for event in events] == [(1, {"n": 1}), (2, {"n": 2})]


async def _renew(side: Side, run: AgentRun) -> AgentRun:
    async with side.db.transaction() as tx:
        return await side.runs.renew(tx, run.fence)


async def _take_back(side: Side, run: AgentRun) -> AgentRun | None:
    async with side.db.transaction() as tx:
        return await side.runs.take_back(
            tx, TakeBack(run.id, run.epoch, retry_budget=3, delay=timedelta(0))
        )


async def test_a_claimer_whose_candidates_another_holds_looks_further_down_the_order(
    side: SideMaker,
) -> None:
    clock = ManualClock(START)
    first, second = side(clock), side(clock)
    for index in range(40):
        await enqueue(first, f"s-{index}")
    async with first.db.transaction() as holding:
        taken = await first.runs.claim(holding, ClaimRequest(holder="first", limit=20))
        # The first claimer holds the first 20 heads locked: every candidate of a plain pool.
        async with second.db.transaction() as tx:
            more = await second.runs.claim(tx, ClaimRequest(holder="second", limit=5))
    assert len(taken) == 20
    assert len(more) == 5
    assert not {run.id for run in taken} & {run.id for run in more}


async def test_require_current_holds_the_lease_until_the_callers_transaction_ends(
    side: SideMaker, postgres_url: str
) -> None:
    holder = side(ManualClock(START))
    run = await enqueue(holder, "s")
    leased = await claim_one(holder)
    holder.clock.advance(LEASE - timedelta(seconds=1))
    reaper = side(ManualClock(START + LEASE + timedelta(seconds=1)))

    async with holder.db.transaction() as tx:
        await holder.runs.require_current(tx, leased.fence)
        take_back = asyncio.create_task(_take_back(reaper, leased))
        await some_session_waits_on_a_lock(postgres_url)  # the reaper waits on the holder
        async with holder.db.transaction() as peek:
            during = await holder.runs.get(peek, run.id)
        assert during is not None
        assert during.state is AgentRunState.LEASED
    taken = await take_back  # once the holder's transaction ends, the expired lease goes
    assert taken is not None
    assert taken.state is AgentRunState.QUEUED
