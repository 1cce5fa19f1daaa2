"""The heartbeat through long steps on every backend (ADRs/0023): a step that runs past its lease
keeps it, a step whose lease is lost is stopped, and short steps never pay for a heartbeat."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import pytest

from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.metrics import NoMetrics
from agentruns.app.ports import RenewWrite, Transaction
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.errors import AgentRunsError, LeaseExpired, StaleEpoch
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun, AgentRunFence
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome, TerminationReason
from tests.contract.conftest import Backend
from tests.contract.kinds import BACKOFF, LEASE, policy
from tests.contract.test_worker import within


class Renewals:
    """Counts the heartbeat statements the store is asked for, and the leases they renew."""

    def __init__(self, backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.fences = 0
        store = backend.stores.runs
        renew_many = store.renew_many

        async def counted(
            tx: Transaction, fences: Sequence[AgentRunFence]
        ) -> list[AgentRunsError | None]:
            self.calls += 1
            self.fences += len(fences)
            return await renew_many(tx, fences)

        monkeypatch.setattr(store, "renew_many", counted)


class Long:
    """Steps of kind ``long``: one step, then a long one as the test scripts it."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = 0
        self.finished = 0
        self.call: asyncio.Future[None] | None = None

    async def steps(self, run: AgentRun) -> AsyncIterator[StepEvent]:
        yield StepEvent("step", {"index": 0})
        self.started.set()
        try:
            assert self.call is not None
            await self.call
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        yield StepEvent("step", {"index": 1})


@pytest.fixture
def long(kinds: RunKinds) -> Long:
    long = Long()
    kinds.register(RunKind(policy("long"), long.steps))
    return long


def keeping_worker(runs: AgentRuns, kinds: RunKinds, backend: Backend, **options: object) -> Worker:
    """A worker whose keeper looks every 5 ms and reads the test's manual clock."""
    return Worker(
        runs,
        kinds,
        backend.stores.notifier,
        random.Random(3),
        holder="keeper-1",
        poll_interval=0.05,
        heartbeat=0.005,
        clock=backend.clock,
        **options,  # type: ignore[arg-type]
    )


async def test_a_step_longer_than_its_lease_keeps_it(
    runs: AgentRuns,
    kinds: RunKinds,
    backend: Backend,
    reaper: AgentRunReaper,
    long: Long,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three leases pass on the clock inside one step: the keeper renews it as the clock says,
    the reaper finds nothing to take back, and the run completes once, in its first claim."""
    renewals = Renewals(backend, monkeypatch)
    worker = keeping_worker(runs, kinds, backend)
    run = await runs.enqueue("long", workspace="acme", subject="s")
    long.call = asyncio.get_running_loop().create_future()
    [leased] = await runs.claim(worker.holder)
    holder = asyncio.create_task(worker.drive(leased))
    await within(long.started.wait())
    await worker.keeper.beat()  # the keeper has seen the step begin
    for _ in range(15):  # three leases, a fifth at a time
        backend.clock.advance(LEASE / 5)
        await worker.keeper.beat()
        reaped = await reaper.tick()
        assert reaped.taken_back == 0
    long.call.set_result(None)
    assert await within(holder) is RunOutcome.COMPLETED
    ended = await runs.get(run.id)
    assert ended.end_reason is TerminationReason.COMPLETED
    assert ended.epoch == leased.epoch
    assert [event.data["index"] for event in await runs.events(run.id)] == [0, 1]
    assert long.finished == 1
    assert long.cancelled == 0
    assert worker.keeper.renewals >= 7  # at least one in every third of a lease
    assert renewals.fences == worker.keeper.renewals


async def test_the_keepers_own_looks_renew_a_step_that_runs_long_in_real_time(
    runs: AgentRuns, kinds: RunKinds, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the monotonic clock alone (no clock moves): a step that runs well past a third of a
    short lease is renewed by the keeper's timer, with the group, and completes."""
    brief = RunKindPolicy(name="brief-lease", lease=timedelta(milliseconds=60), backoff=BACKOFF)
    kinds.register(RunKind(brief, _sleeps))
    renewals = Renewals(backend, monkeypatch)
    metrics = _CountedRenewals()
    worker = Worker(
        runs,
        kinds,
        backend.stores.notifier,
        random.Random(3),
        holder="keeper-2",
        heartbeat=0.005,
        metrics=metrics,
    )
    run = await runs.enqueue("brief-lease", workspace="acme", subject="s", payload={"sleep": 0.3})
    [leased] = await runs.claim(worker.holder)
    assert await within(worker.drive(leased)) is RunOutcome.COMPLETED
    assert (await runs.get(run.id)).end_reason is TerminationReason.COMPLETED
    # About one renewal every 20 ms of the 300 ms step; a loaded machine may manage fewer.
    assert worker.keeper.renewals >= 2
    assert renewals.calls >= 1
    assert renewals.fences == worker.keeper.renewals
    # The metrics count a heartbeat as a renewal, beside the two step boundaries.
    assert metrics.renewed_count == worker.keeper.renewals + 2


class _CountedRenewals(NoMetrics):
    def __init__(self) -> None:
        self.renewed_count = 0

    def renewed(self, kind: str) -> None:
        self.renewed_count += 1


async def _sleeps(run: AgentRun) -> AsyncIterator[StepEvent]:
    await asyncio.sleep(float(run.payload.get("sleep", 0.0)))  # type: ignore[arg-type]
    yield StepEvent("step", {"index": 0})
    await asyncio.sleep(float(run.payload.get("sleep", 0.0)))  # type: ignore[arg-type]
    yield StepEvent("step", {"index": 1})


async def test_a_step_whose_lease_was_taken_back_is_stopped_within_a_heartbeat(
    runs: AgentRuns, kinds: RunKinds, backend: Backend, reaper: AgentRunReaper, long: Long
) -> None:
    """The lease runs out inside the step and the reaper takes the run back: the keeper's next
    renewal is refused, the step's work sees CancelledError, and the holder stops without
    settling the run (it stays queued for its next holder, with only the first step's event)."""
    worker = keeping_worker(runs, kinds, backend)
    run = await runs.enqueue("long", workspace="acme", subject="s")
    long.call = asyncio.get_running_loop().create_future()
    [leased] = await runs.claim(worker.holder)
    holder = asyncio.create_task(worker.drive(leased))
    await within(long.started.wait())
    await worker.keeper.beat()  # seen at the step's start
    backend.clock.advance(LEASE * 2)
    assert (await reaper.tick()).taken_back == 1
    # No beat from the test: the keeper's own timer renews, is refused, and stops the step.
    assert await within(holder) is RunOutcome.LEASE_LOST
    assert long.cancelled == 1
    assert long.finished == 0
    after = await runs.get(run.id)
    assert after.state is AgentRunState.QUEUED
    assert [event.data["index"] for event in await runs.events(run.id)] == [0]


async def test_short_steps_write_no_heartbeat(
    runs: AgentRuns, kinds: RunKinds, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs whose steps take milliseconds of a 30 s lease: the keeper looks every 5 ms and
    never writes; their boundaries are their renewals."""
    kinds.register(RunKind(policy("quick"), _sleeps))
    renewals = Renewals(backend, monkeypatch)
    worker = keeping_worker(runs, kinds, backend, concurrency=4)
    for index in range(8):
        await runs.enqueue("quick", workspace="acme", subject=f"s{index}", payload={"sleep": 0.01})
    await within(worker.run(asyncio.Event(), drain=True))
    assert worker.stats.outcomes == {RunOutcome.COMPLETED: 8}
    assert renewals.calls == 0
    assert worker.keeper.renewals == 0


async def test_a_group_heartbeat_renews_each_lease_under_its_own_fence(
    runs: AgentRuns, backend: Backend
) -> None:
    """settle_group's renewal-only write: a held fence is renewed (its lease pushed to now +
    its length), a stale one and an expired one are refused alone, nothing else written."""
    for subject in ("a", "b", "c"):
        await runs.enqueue("chat", workspace="acme", subject=subject)
    first, second, third = await runs.claim("h", limit=3)
    backend.clock.advance(LEASE / 2)
    renewed = await runs.renew(third.fence)
    stale = AgentRunFence(second.id, second.workspace, second.epoch - 1)
    backend.clock.advance(LEASE * 3 / 4)  # the third's lease holds, the first's ran out
    answers = await runs.settle_group(
        [RenewWrite(first.fence), RenewWrite(stale), RenewWrite(third.fence)]
    )
    assert isinstance(answers[0], LeaseExpired)
    assert isinstance(answers[1], StaleEpoch)
    assert answers[2] is None
    after = await runs.get(third.id)
    assert after.leased_until == backend.clock.now() + LEASE
    assert renewed.leased_until is not None
    assert after.leased_until > renewed.leased_until
    assert await runs.events(third.id) == []
    assert (await runs.get(second.id)).leased_until == second.leased_until
