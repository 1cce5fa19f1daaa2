"""The worker runtime on every backend: renew before append, lost leases, recovery, shutdown."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Sequence
from datetime import timedelta
from typing import TypeVar

import pytest

from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.metrics import NoMetrics
from agentruns.app.ports import RunEvent
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.bands import Band
from agentruns.domain.failures import FailureClass, ProviderError
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import GIVE_BACK_DELAY, RunOutcome, TerminationReason
from tests.contract.conftest import Backend
from tests.contract.kinds import BACKOFF, LEASE, policy, scripted_steps

T = TypeVar("T")

# A bound so that a broken test fails instead of hanging; never a timing assertion.
BOUND = 5.0


async def within(awaitable: Awaitable[T]) -> T:
    async with asyncio.timeout(BOUND):
        return await awaitable


class Gate:
    """Steps of kind ``gated``: the second step waits at the gate until the test opens it.

    Only a claim under one of ``epochs`` waits, so a later holder of the same run runs through.
    """

    def __init__(self, epochs: frozenset[int] = frozenset({1})) -> None:
        self.epochs = epochs
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()

    async def steps(self, run: AgentRun) -> AsyncIterator[StepEvent]:
        yield StepEvent("step", {"index": 0})
        if run.epoch in self.epochs:
            self.reached.set()
            await self.opened.wait()
        yield StepEvent("step", {"index": 1})


@pytest.fixture
def gate(kinds: RunKinds) -> Gate:
    gate = Gate()
    kinds.register(RunKind(policy("gated"), gate.steps))
    return gate


def indexed(events: list[RunEvent]) -> list[tuple[int, object]]:
    """(epoch, step index) of each event, in log order."""
    return [(event.epoch, event.data["index"]) for event in events]


def other_worker(backend: Backend, runs: AgentRuns, kinds: RunKinds, holder: str) -> Worker:
    return Worker(runs, kinds, backend.stores.notifier, random.Random(1), holder=holder)


async def test_a_worker_claims_only_the_kinds_it_can_run(
    backend: Backend, kinds: RunKinds, rng: random.Random
) -> None:
    """A run of a kind the worker does not know stays queued for a worker that does, whether
    the database has seen other kinds (the kinds claim) or not (the lanes serve)."""

    async def steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        yield StepEvent("step", {"index": 0})

    enqueuer = AgentRuns(backend.stores, kinds, rng)
    await enqueuer.enqueue("chat", workspace="acme", subject="known")
    await enqueuer.enqueue("review", workspace="globex", subject="unknown")
    mine = RunKinds([RunKind(policy("chat"), steps), RunKind(policy("later"), steps)])
    runs = AgentRuns(backend.stores, mine, rng)
    worker = Worker(runs, mine, backend.stores.notifier, rng, holder="chat-only")
    assert await within(worker.claim_and_drive(limit=10)) == 1
    assert await within(worker.claim_and_drive(limit=10)) == 0
    [review] = (await enqueuer.list_runs(kind="review")).runs
    assert review.state is AgentRunState.QUEUED
    # Every kind the database has seen is known here: the lane claim serves, still only these.
    everyone = Worker(enqueuer, kinds, backend.stores.notifier, rng, holder="all")
    assert await within(everyone.claim_and_drive(limit=10)) == 1
    assert (await enqueuer.get(review.id)).end_reason is TerminationReason.COMPLETED


async def test_a_run_of_a_kind_not_registered_here_is_given_back_uncharged(
    backend: Backend, runs: AgentRuns, rng: random.Random
) -> None:
    """A worker that leased a run whose kind it does not know (a claim outside its registry)
    gives it back without spending an attempt, records why, and a worker that knows it runs
    it once it is due again."""
    chat = await runs.enqueue("chat", workspace="acme", subject="s", payload={"steps": 1})
    [leased] = await runs.claim("other", kinds=["chat"])
    strangers = RunKinds([RunKind(policy("unrelated"), scripted_steps)])
    stranger = Worker(
        AgentRuns(backend.stores, strangers, rng),
        strangers,
        backend.stores.notifier,
        rng,
        holder="stranger",
    )
    assert await within(stranger.drive(leased)) is RunOutcome.REQUEUED
    back = await runs.get(chat.id)
    assert (back.state, back.attempt, back.epoch) == (AgentRunState.QUEUED, 0, 1)
    assert back.due_at - back.enqueued_at >= GIVE_BACK_DELAY
    assert back.last_failure is not None
    assert back.last_failure.failure_class is FailureClass.UNKNOWN_KIND
    [record] = await runs.failures(chat.id)
    assert record.error_type == "agentruns.UnknownKind"
    assert (record.epoch, record.attempt) == (1, 0)
    backend.clock.advance(GIVE_BACK_DELAY)
    knower = Worker(runs, runs.kinds, backend.stores.notifier, rng, holder="knower")
    assert await within(knower.claim_and_drive(limit=5)) == 1
    assert (await runs.get(chat.id)).end_reason is TerminationReason.COMPLETED


async def test_a_worker_loop_survives_a_kind_its_registry_does_not_know(
    backend: Backend, runs: AgentRuns, rng: random.Random
) -> None:
    """A worker whose claim names a kind its own registry lacks (only_kinds checked against
    another registry) gives the run back and keeps going: no task dies with the run leased."""
    chat = await runs.enqueue("chat", workspace="acme", subject="s", payload={"steps": 1})
    strangers = RunKinds([RunKind(policy("unrelated"), scripted_steps)])
    worker = Worker(
        runs,
        strangers,
        backend.stores.notifier,
        rng,
        holder="mismatched",
        only_kinds=["chat"],
        poll_interval=0.05,
    )
    await within(worker.run(asyncio.Event(), drain=True))
    assert worker.stats.outcomes == {RunOutcome.REQUEUED: 1}
    assert (await runs.get(chat.id)).state is AgentRunState.QUEUED


async def test_a_run_whose_unknown_kind_keeps_a_domain_row_is_left_to_its_lease(
    backend: Backend, runs: AgentRuns, rng: random.Random
) -> None:
    """Only the kind's handler may move its domain row: a worker that does not know the kind
    leaves the run leased (for a reaper that knows it) rather than move the run alone."""
    review = await runs.enqueue("review", workspace="acme", subject="pr:1")
    [leased] = await runs.claim("other", kinds=["review"])
    strangers = RunKinds([RunKind(policy("unrelated"), scripted_steps)])
    stranger = Worker(
        AgentRuns(backend.stores, strangers, rng),
        strangers,
        backend.stores.notifier,
        rng,
        holder="stranger",
    )
    assert await within(stranger.drive(leased)) is RunOutcome.LEASE_LOST
    still = await runs.get(review.id)
    assert (still.state, still.epoch, still.attempt) == (AgentRunState.LEASED, 1, 0)


async def test_the_lease_is_renewed_at_every_step_boundary(
    runs: AgentRuns, worker: Worker, kinds: RunKinds, backend: Backend
) -> None:
    """Steps that together outlast the lease complete, because each boundary renews it."""
    seen: list[timedelta] = []
    start = backend.clock.now()

    async def slow_steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        for index in range(3):
            backend.clock.advance(timedelta(seconds=20))  # each step takes 2/3 of the lease
            yield StepEvent("step", {"index": index})
            leased_until = (await runs.get(run.id)).leased_until
            assert leased_until is not None
            seen.append(leased_until - start)

    kinds.register(RunKind(policy("slow"), slow_steps))
    run = await runs.enqueue("slow", workspace="acme", subject="s")
    [leased] = await runs.claim(worker.holder)
    assert await worker.drive(leased) is RunOutcome.COMPLETED
    assert seen == [timedelta(seconds=20 * step) + LEASE for step in (1, 2, 3)]
    assert indexed(await runs.events(run.id)) == [(1, 0), (1, 1), (1, 2)]
    assert (await runs.get(run.id)).end_reason is TerminationReason.COMPLETED


async def test_a_zombie_never_appends_after_its_run_was_taken_back_and_claimed_again(
    runs: AgentRuns,
    worker: Worker,
    reaper: AgentRunReaper,
    kinds: RunKinds,
    backend: Backend,
    gate: Gate,
) -> None:
    """A holder stalled past its lease loses the run to a new holder and appends nothing more."""
    run = await runs.enqueue("gated", workspace="acme", subject="s")
    [leased] = await runs.claim(worker.holder)
    zombie = asyncio.create_task(worker.drive(leased))
    await within(gate.reached.wait())

    backend.clock.advance(LEASE)
    assert (await reaper.tick()).requeued == 1
    backend.clock.advance(BACKOFF.base)
    second = other_worker(backend, runs, kinds, "worker-2")
    [reclaimed] = await runs.claim(second.holder)
    assert (reclaimed.id, reclaimed.epoch) == (run.id, 2)

    gate.opened.set()
    assert await within(zombie) is RunOutcome.LEASE_LOST
    assert indexed(await runs.events(run.id)) == [(1, 0)]
    after = await runs.get(run.id)
    assert (after.state, after.epoch, after.holder) == (AgentRunState.LEASED, 2, "worker-2")

    assert await second.drive(reclaimed) is RunOutcome.COMPLETED
    assert indexed(await runs.events(run.id)) == [(1, 0), (2, 0), (2, 1)]


async def test_an_expired_lease_stops_the_holder_without_settling_the_run(
    runs: AgentRuns, worker: Worker, reaper: AgentRunReaper, backend: Backend, gate: Gate
) -> None:
    """A holder whose lease ran out appends nothing and leaves the run to the reaper."""
    run = await runs.enqueue("gated", workspace="acme", subject="s")
    [leased] = await runs.claim(worker.holder)
    holder = asyncio.create_task(worker.drive(leased))
    await within(gate.reached.wait())
    backend.clock.advance(LEASE)
    gate.opened.set()

    assert await within(holder) is RunOutcome.LEASE_LOST
    assert indexed(await runs.events(run.id)) == [(1, 0)]
    unsettled = await runs.get(run.id)
    assert (unsettled.state, unsettled.epoch, unsettled.attempt, unsettled.holder) == (
        AgentRunState.LEASED,
        1,
        0,
        worker.holder,
    )
    assert (await reaper.tick()).requeued == 1
    assert (await runs.get(run.id)).attempt == 1


@pytest.mark.parametrize("status", [503, 429])
async def test_a_retryable_failure_requeues_with_one_more_attempt_after_backoff(
    runs: AgentRuns, worker: Worker, backend: Backend, status: int
) -> None:
    """A 5xx or 429 is a charged requeue, due after the backoff of the attempt it starts."""
    run = await runs.enqueue(
        "chat", workspace="acme", subject="c", payload={"steps": 1, "fail": status}
    )
    [leased] = await runs.claim(worker.holder)
    assert await worker.drive(leased) is RunOutcome.REQUEUED

    after = await runs.get(run.id)
    assert (after.state, after.epoch, after.attempt, after.holder) == (
        AgentRunState.QUEUED,
        1,
        1,
        None,
    )
    assert after.due_at == backend.clock.now() + BACKOFF.base
    assert indexed(await runs.events(run.id)) == [(1, 0)]
    assert await runs.claim("early") == []
    backend.clock.advance(BACKOFF.base)
    [again] = await runs.claim("on-time")
    assert (again.id, again.epoch, again.attempt) == (run.id, 2, 1)


@pytest.mark.parametrize("fail", [401, "chain"], ids=["401", "chain-ending-in-401"])
async def test_a_failure_that_is_not_retryable_ends_the_run_not_retryable(
    runs: AgentRuns, worker: Worker, fail: object
) -> None:
    """A 401, or a fallback chain whose last provider answered 401, is dead-lettered at once."""
    run = await runs.enqueue(
        "chat", workspace="acme", subject="c", payload={"steps": 2, "fail": fail}
    )
    [leased] = await runs.claim(worker.holder)
    assert await worker.drive(leased) is RunOutcome.FAILED

    after = await runs.get(run.id)
    assert (after.state, after.end_reason, after.attempt) == (
        AgentRunState.ENDED,
        TerminationReason.NOT_RETRYABLE,
        0,
    )
    assert after.end_reason is not None
    assert after.end_reason.is_dead_letter
    assert indexed(await runs.events(run.id)) == [(1, 0), (1, 1)]


async def test_a_retryable_failure_at_the_budget_ends_the_run_retries_exhausted(
    runs: AgentRuns, worker: Worker, backend: Backend
) -> None:
    """Each retry waits a doubled backoff; the failure after the last allowed retry ends it."""
    run = await runs.enqueue(
        "chat", workspace="acme", subject="c", payload={"steps": 0, "fail": 503}
    )
    delays: list[timedelta] = []
    for attempt in (1, 2, 3):
        [leased] = await runs.claim(worker.holder)
        assert await worker.drive(leased) is RunOutcome.REQUEUED
        after = await runs.get(run.id)
        assert after.attempt == attempt
        delays.append(after.due_at - backend.clock.now())
        backend.clock.set(after.due_at)
    assert delays == [BACKOFF.base, 2 * BACKOFF.base, 4 * BACKOFF.base]

    [last] = await runs.claim(worker.holder)
    assert await worker.drive(last) is RunOutcome.FAILED
    ended = await runs.get(run.id)
    assert (ended.state, ended.end_reason, ended.attempt, ended.epoch) == (
        AgentRunState.ENDED,
        TerminationReason.RETRIES_EXHAUSTED,
        3,
        4,
    )


async def test_a_cancel_while_running_is_seen_by_the_worker_as_cancelled(
    runs: AgentRuns, worker: Worker, gate: Gate
) -> None:
    """A run cancelled mid-step ends CANCELLED, and its holder stops at the next boundary."""
    run = await runs.enqueue("gated", workspace="acme", subject="s")
    [leased] = await runs.claim(worker.holder)
    holder = asyncio.create_task(worker.drive(leased))
    await within(gate.reached.wait())
    cancelled = await runs.cancel(run.id)
    gate.opened.set()

    assert await within(holder) is RunOutcome.CANCELLED
    after = await runs.get(run.id)
    assert after == cancelled
    assert (after.state, after.end_reason) == (AgentRunState.ENDED, TerminationReason.CANCELLED)
    assert indexed(await runs.events(run.id)) == [(1, 0)]


async def test_graceful_shutdown_stops_claiming_and_lets_the_running_step_finish(
    runs: AgentRuns, kinds: RunKinds, backend: Backend, gate: Gate
) -> None:
    """After stop is set the worker claims nothing new and finishes its step within the grace."""
    worker = Worker(
        runs, kinds, backend.stores.notifier, random.Random(1), holder="w", concurrency=1
    )
    running = await runs.enqueue("gated", workspace="acme", subject="a")
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run(stop, grace=BOUND))
    await within(gate.reached.wait())

    stop.set()
    waiting = await runs.enqueue("chat", workspace="acme", subject="b", payload={"steps": 1})
    gate.opened.set()
    await within(loop)

    finished = await runs.get(running.id)
    assert (finished.state, finished.end_reason) == (
        AgentRunState.ENDED,
        TerminationReason.COMPLETED,
    )
    assert indexed(await runs.events(running.id)) == [(1, 0), (1, 1)]
    left = await runs.get(waiting.id)
    assert (left.state, left.epoch) == (AgentRunState.QUEUED, 0)
    assert worker.stats.claimed == 1


async def test_a_step_that_outlasts_the_grace_is_left_to_lease_expiry(
    runs: AgentRuns, kinds: RunKinds, reaper: AgentRunReaper, backend: Backend, gate: Gate
) -> None:
    """Shutdown abandons a step still running after the grace; the reaper takes the run back."""
    worker = Worker(runs, kinds, backend.stores.notifier, random.Random(1), holder="w")
    run = await runs.enqueue("gated", workspace="acme", subject="a")
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run(stop, grace=0.01))
    await within(gate.reached.wait())
    stop.set()
    await within(loop)

    abandoned = await runs.get(run.id)
    assert (abandoned.state, abandoned.epoch, abandoned.holder) == (AgentRunState.LEASED, 1, "w")
    assert indexed(await runs.events(run.id)) == [(1, 0)]
    backend.clock.advance(LEASE)
    assert (await reaper.tick()).requeued == 1


async def test_an_idle_worker_wakes_on_enqueue_before_its_poll_interval(
    runs: AgentRuns, kinds: RunKinds, backend: Backend
) -> None:
    """A worker polling every 30 s claims a run queued while it idles, through the notifier."""
    claimed = asyncio.Event()

    async def signalling_steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        claimed.set()
        yield StepEvent("step", {"index": 0})

    kinds.register(RunKind(policy("signal"), signalling_steps))
    worker = Worker(
        runs, kinds, backend.stores.notifier, random.Random(1), holder="w", poll_interval=30.0
    )
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run(stop, grace=BOUND))
    for _ in range(10):  # let the worker find nothing and go idle on the notifier
        await asyncio.sleep(0)
    assert worker.stats.claimed == 0

    run = await runs.enqueue("signal", workspace="acme", subject="s")
    await within(claimed.wait())
    stop.set()
    await within(loop)
    assert (await runs.get(run.id)).end_reason is TerminationReason.COMPLETED


async def test_a_host_driving_a_run_itself_gets_the_failure_unchanged(
    runs: AgentRuns, kinds: RunKinds
) -> None:
    """An interactive caller iterating a kind's steps sees the ProviderError; nothing settles."""
    run = await runs.enqueue(
        "chat",
        workspace="acme",
        subject="conversation:1",
        band=Band.INTERACTIVE,
        payload={"steps": 1, "fail": 401},
    )
    leased = await runs.claim_subject("host", "acme", "conversation:1", kinds=["chat"])
    assert leased is not None
    assert leased.id == run.id

    async def drive_it_myself(run: AgentRun) -> None:
        async for event in kinds.get("chat").steps(run):
            async with runs.transaction() as tx:
                await runs.renew(run.fence, tx=tx)
                await runs.append_event(run.fence, event.type, event.data, tx=tx)

    with pytest.raises(ProviderError) as failure:
        await drive_it_myself(leased)
    assert (type(failure.value), failure.value.status) == (ProviderError, 401)

    after = await runs.get(run.id)
    assert (after.state, after.epoch, after.attempt, after.holder) == (
        AgentRunState.LEASED,
        1,
        0,
        "host",
    )
    assert indexed(await runs.events(run.id)) == [(1, 0)]


async def test_a_store_outage_mid_run_stops_the_holder_without_settling() -> None:
    """When the store cannot be reached at a step boundary, the worker's outcome is LEASE_LOST
    (it cannot prove its lease), nothing escapes the task, and the run is left to the reaper."""
    import random as _random
    from collections.abc import AsyncIterator as _AsyncIterator
    from contextlib import asynccontextmanager

    from agentruns.adapters.clock import ManualClock
    from agentruns.adapters.memory import MemoryDatabase, MemoryFamily, MemoryTransaction
    from agentruns.app.kinds import RunKind, RunKinds, StepEvent
    from agentruns.app.runs import AgentRuns
    from agentruns.app.worker import Worker
    from agentruns.domain.errors import StoreUnavailable
    from agentruns.domain.kinds import RunKindPolicy
    from agentruns.domain.run import AgentRun as _AgentRun
    from agentruns.domain.termination import RunOutcome as _RunOutcome

    family = MemoryFamily(ManualClock())
    database: MemoryDatabase = family.database
    outage = {"on": False}
    opened = database.transaction

    @asynccontextmanager
    async def flaky_transaction() -> _AsyncIterator[MemoryTransaction]:
        if outage["on"]:
            raise StoreUnavailable("the database is restarting")
        async with opened() as tx:
            yield tx

    database.transaction = flaky_transaction  # type: ignore[method-assign]

    async def steps(run: _AgentRun) -> _AsyncIterator[StepEvent]:
        outage["on"] = True
        yield StepEvent("after the outage began")

    kinds = RunKinds([RunKind(RunKindPolicy("fragile"), steps)])
    runs = AgentRuns(family.stores, kinds, _random.Random(1))
    worker = Worker(runs, kinds, family.notifier, _random.Random(2), holder="w")
    await runs.enqueue("fragile", workspace="acme", subject="s")
    [run] = await runs.claim("w")
    assert await worker.drive(run) is _RunOutcome.LEASE_LOST
    outage["on"] = False
    left = await runs.get(run.id)
    assert left.state.value == "leased"
    assert await runs.events(run.id) == []


async def test_the_loop_fills_its_slots_in_cohorts_of_at_most_half_of_them(
    runs: AgentRuns, kinds: RunKinds, backend: Backend
) -> None:
    """A worker with 8 slots claims at most 4 runs per claim, and claims again at once until
    every slot runs: one cohort's writes overlap the next one's claim (ADRs/0019)."""
    arrived = 0
    all_running = asyncio.Event()
    release = asyncio.Event()

    async def held_steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        nonlocal arrived
        arrived += 1
        if arrived == 8:
            all_running.set()
        await release.wait()
        yield StepEvent("step", {"index": 0})

    class Claims(NoMetrics):
        def __init__(self) -> None:
            self.sizes: list[int] = []

        def claimed(self, claimed: Sequence[AgentRun], seconds: float) -> None:
            self.sizes.append(len(claimed))

    kinds.register(RunKind(policy("held"), held_steps))
    for n in range(12):
        await runs.enqueue("held", workspace="acme", subject=f"s{n}")
    metrics = Claims()
    worker = Worker(
        runs, kinds, backend.stores.notifier, random.Random(1), holder="w", concurrency=8,
        metrics=metrics,
    )  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run(stop, grace=BOUND))
    await within(all_running.wait())
    assert [size for size in metrics.sizes if size] == [4, 4]
    stop.set()
    release.set()
    await within(loop)
    assert worker.stats.claimed == 8
