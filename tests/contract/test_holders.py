"""The holder store, the leases that may be quiet and the holders' view, on every backend."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import timedelta

from agentruns.app.holders import AgentHolders
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.ports import HolderStore
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.holders import Holder, HolderBeat, LeaseScan, Quiet
from agentruns.domain.run import AgentRun
from tests.contract.conftest import START, Backend
from tests.contract.kinds import LEASE, policy

RENEWAL = timedelta(seconds=10)


def beat(holder: str = "w1", *kinds: str, process: str = "agentruns-worker") -> HolderBeat:
    return HolderBeat(holder, process, kinds or ("chat",), RENEWAL)


async def rows(backend: Backend) -> list[Holder]:
    async with backend.stores.scope.transaction() as tx:
        return await backend.family.holders.all(tx)


async def test_a_holder_starts_beats_and_stops_on_the_store_clock(backend: Backend) -> None:
    """Its start, each beat and its stop are written at the store's now; a beat keeps the start
    and takes the beat's kinds."""
    store: HolderStore = backend.family.holders
    async with backend.stores.scope.transaction() as tx:
        started = await store.started(tx, beat("w1", "chat", "sweep"))
    assert started == Holder("w1", "agentruns-worker", ("chat", "sweep"), RENEWAL, START, START)
    backend.clock.advance(timedelta(seconds=7))
    async with backend.stores.scope.statement() as tx:
        seen = await store.seen(tx, beat("w1", "chat"))
    assert (seen.started_at, seen.seen_at, seen.kinds) == (
        START,
        START + timedelta(seconds=7),
        ("chat",),
    )
    backend.clock.advance(timedelta(seconds=2))
    async with backend.stores.scope.statement() as tx:
        await store.stopped(tx, "w1")
        await store.stopped(tx, "nobody")  # no row: nothing written
    [stopped] = await rows(backend)
    stop = START + timedelta(seconds=9)
    assert (stopped.holder, stopped.seen_at, stopped.stopped_at) == ("w1", stop, stop)


async def test_a_start_is_a_new_life_and_a_beat_writes_a_forgotten_row_again(
    backend: Backend,
) -> None:
    store = backend.family.holders
    async with backend.stores.scope.transaction() as tx:
        await store.started(tx, beat("w1"))
        await store.stopped(tx, "w1")
    backend.clock.advance(timedelta(minutes=1))
    later = START + timedelta(minutes=1)
    async with backend.stores.scope.transaction() as tx:
        again = await store.started(tx, beat("w1", process="reworked"))
        fresh = await store.seen(tx, beat("w2"))  # never started here: written, started now
    assert (again.process, again.started_at, again.stopped_at) == ("reworked", later, None)
    assert (fresh.started_at, fresh.seen_at) == (later, later)
    assert [row.holder for row in await rows(backend)] == ["w1", "w2"]


async def test_forget_deletes_the_rows_not_seen_for_longer_than_given(backend: Backend) -> None:
    store = backend.family.holders
    async with backend.stores.scope.transaction() as tx:
        await store.started(tx, beat("old"))
    backend.clock.advance(timedelta(hours=2))
    async with backend.stores.scope.transaction() as tx:
        await store.started(tx, beat("new"))
        assert await store.forget(tx, timedelta(hours=1)) == 1
        assert await store.forget(tx, timedelta(hours=1)) == 0
    assert [row.holder for row in await rows(backend)] == ["new"]


async def test_held_leases_are_those_renewed_before_or_held_by_no_live_holder(
    backend: Backend, runs: AgentRuns
) -> None:
    """The store reads the leases that may be quiet, oldest renewal first; queued kinds count
    every queued run, due or not."""
    for subject in ("a", "b", "c"):
        await runs.enqueue("chat", workspace="acme", subject=subject)
    await runs.enqueue("sweep", workspace="acme", subject="later", due_at=START + timedelta(days=1))
    [first] = await runs.claim("alive", kinds=["chat"])
    backend.clock.advance(timedelta(seconds=40))
    [second] = await runs.claim("alive", kinds=["chat"])
    [third] = await runs.claim("dead", kinds=["chat"])
    now = START + timedelta(seconds=40)
    async with backend.stores.scope.transaction() as tx:
        stale = await backend.family.stats.held_leases(
            tx, LeaseScan(now - timedelta(seconds=30), ("alive",))
        )
        every = await backend.family.stats.held_leases(
            tx, LeaseScan(now + timedelta(seconds=1), ())
        )
        capped = await backend.family.stats.held_leases(
            tx, LeaseScan(now + timedelta(seconds=1), ()), limit=1
        )
        queued = await backend.family.stats.queued_kinds(tx)
    assert [lease.run_id for lease in stale] == [first.id, third.id]
    assert [lease.run_id for lease in every] == [first.id, second.id, third.id]
    assert [lease.run_id for lease in capped] == [first.id]
    lease = stale[0]
    assert (lease.holder, lease.epoch, lease.lease, lease.renewed_at) == ("alive", 1, LEASE, START)
    assert (lease.kind, lease.workspace, lease.subject) == ("chat", "acme", "a")
    assert queued == {"sweep": 1}


async def test_the_view_shows_live_and_gone_holders_quiet_leases_and_kinds_nobody_claims(
    backend: Backend, runs: AgentRuns
) -> None:
    """A holder not seen for three renewals is gone and its leases are quiet; a live holder's
    lease not renewed for three renewals is quiet; a lease without a holder row is judged by its
    renewals against the expected one; a queued kind no live holder claims is shown."""
    store = backend.family.holders
    async with backend.stores.scope.transaction() as tx:
        await store.started(tx, beat("alive", "chat"))
        await store.started(tx, beat("dead", "sweep"))
    for subject in ("a", "b", "c", "d"):
        await runs.enqueue("chat", workspace="acme", subject=subject)
    await runs.enqueue("review", workspace="acme", subject="nobody-claims-it")
    [stuck] = await runs.claim("alive", kinds=["chat"])
    [orphan] = await runs.claim("dead", kinds=["chat"])
    [rowless] = await runs.claim("sandbox:1", kinds=["chat"])
    backend.clock.advance(timedelta(seconds=25))
    [fresh] = await runs.claim("alive", kinds=["chat"])
    async with backend.stores.scope.statement() as tx:
        await store.seen(tx, beat("alive", "chat"))
    backend.clock.advance(timedelta(seconds=6))  # dead: 31 s unseen; stuck: 31 s unrenewed
    holders = AgentHolders(
        backend.stores.scope, backend.stores.runs, store, backend.family.stats, renewal=RENEWAL
    )
    view = await holders.view()
    assert view.now == START + timedelta(seconds=31)
    assert [row.holder for row in view.live] == ["alive"]
    assert [row.holder for row in view.gone] == ["dead"]
    assert [(q.lease.run_id, q.why) for q in view.quiet] == [
        (stuck.id, Quiet.NOT_RENEWED),
        (orphan.id, Quiet.HOLDER_GONE),
        (rowless.id, Quiet.NOT_RENEWED),
    ]
    assert fresh.id not in {q.lease.run_id for q in view.quiet}
    assert view.quiet[2].holder is None
    assert [(kind.kind, kind.queued) for kind in view.unclaimed] == [("review", 1)]


async def test_a_running_worker_is_a_live_holder_and_a_clean_stop_marks_it_gone(
    backend: Backend, runs: AgentRuns, kinds: RunKinds
) -> None:
    """The worker's heartbeat writes its row before its first claim, with the kinds it claims
    and its process name; a clean stop marks it stopped, so it is gone at once."""
    holders = AgentHolders(
        backend.stores.scope,
        backend.stores.runs,
        backend.family.holders,
        backend.family.stats,
        renewal=RENEWAL,
    )
    worker = Worker(
        runs,
        kinds,
        backend.stores.notifier,
        random.Random(3),
        holder="w-live",
        poll_interval=0.05,
        holders=backend.family.holders,
        renewal=RENEWAL,
        process="agentruns-worker",
    )
    reached = asyncio.Event()

    async def steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        reached.set()
        yield StepEvent("step")

    kinds.register(RunKind(policy("signal"), steps))
    await runs.enqueue("signal", workspace="acme", subject="s")
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    await asyncio.wait_for(reached.wait(), 5)  # the row is written before the first claim
    [live] = (await holders.view()).live
    assert (live.holder, live.process, live.kinds) == (
        "w-live",
        "agentruns-worker",
        tuple(kinds.names()),
    )
    stop.set()
    await asyncio.wait_for(running, 5)
    view = await holders.view()
    assert view.live == ()
    [gone] = view.gone
    assert gone.stopped_at is not None
