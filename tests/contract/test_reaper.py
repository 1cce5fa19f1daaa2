"""The reaper on every backend: expired leases taken back, overdue runs ended, races lost."""

from __future__ import annotations

import random
from datetime import timedelta

from agentruns.app.kinds import NoDomainRow, RunKind, RunKinds
from agentruns.app.ports import Transaction
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.domain.run import AgentRun, RunChange
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from examples.review import ReviewStatus
from tests.contract.conftest import Backend
from tests.contract.kinds import LEASE, policy, scripted_steps


async def test_an_expired_lease_is_queued_again_after_backoff_and_spends_an_attempt(
    runs: AgentRuns, reaper: AgentRunReaper, backend: Backend
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    backend.clock.advance(LEASE)
    report = await reaper.tick()
    assert (report.taken_back, report.requeued) == (1, 1)
    back = await runs.get(run.id)
    assert (back.state, back.attempt, back.epoch, back.holder) == (
        AgentRunState.QUEUED,
        1,
        1,
        None,
    )
    assert back.due_at == backend.clock.now() + timedelta(seconds=10)


async def test_a_live_lease_is_left_alone(
    runs: AgentRuns, reaper: AgentRunReaper, backend: Backend
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    backend.clock.advance(LEASE - timedelta(seconds=1))
    assert (await reaper.tick()).taken_back == 0
    assert (await runs.get(run.id)).state is AgentRunState.LEASED


async def test_a_renewal_before_the_tick_wins(
    runs: AgentRuns, reaper: AgentRunReaper, backend: Backend
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    backend.clock.advance(LEASE - timedelta(seconds=1))
    await runs.renew(run.fence)
    backend.clock.advance(timedelta(seconds=2))
    assert (await reaper.tick()).taken_back == 0
    await runs.renew(run.fence)


async def test_a_lease_lost_at_the_budget_ends_retries_exhausted(
    runs: AgentRuns, reaper: AgentRunReaper, backend: Backend
) -> None:
    run = await runs.enqueue("chat", workspace="acme", subject="c")
    for _ in range(4):
        backend.clock.advance(timedelta(minutes=10))
        [leased] = await runs.claim("w")
        backend.clock.advance(LEASE)
        await reaper.tick()
    ended = await runs.get(run.id)
    assert (ended.state, ended.end_reason, ended.attempt, ended.epoch) == (
        AgentRunState.ENDED,
        TerminationReason.RETRIES_EXHAUSTED,
        3,
        4,
    )
    assert leased.epoch == 4


async def test_a_lease_lost_past_the_deadline_ends_deadline_exceeded(
    runs: AgentRuns, reaper: AgentRunReaper, backend: Backend
) -> None:
    run = await runs.enqueue("sweep", workspace="acme", subject="s")
    await runs.claim("w")
    backend.clock.advance(timedelta(minutes=31))
    await reaper.tick()
    ended = await runs.get(run.id)
    assert ended.end_reason is TerminationReason.DEADLINE_EXCEEDED


async def test_a_queued_run_past_its_deadline_ends(
    runs: AgentRuns, reaper: AgentRunReaper, backend: Backend
) -> None:
    run = await runs.enqueue("sweep", workspace="acme", subject="s")
    backend.clock.advance(timedelta(minutes=30))
    report = await reaper.tick()
    assert report.overdue_ended == 1
    assert (await runs.get(run.id)).end_reason is TerminationReason.DEADLINE_EXCEEDED


async def test_a_stale_holder_cannot_write_after_the_take_back(
    runs: AgentRuns, reaper: AgentRunReaper, backend: Backend
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [zombie] = await runs.claim("w1")
    backend.clock.advance(LEASE)
    await reaper.tick()
    backend.clock.advance(timedelta(seconds=10))
    [heir] = await runs.claim("w2")
    assert heir.epoch == zombie.epoch + 1
    from agentruns.domain.errors import LeaseLost

    for write in (
        runs.renew(zombie.fence),
        runs.append_event(zombie.fence, "step"),
        runs.end(zombie.fence, TerminationReason.COMPLETED),
    ):
        try:
            await write
        except LeaseLost:
            continue
        raise AssertionError("a zombie's write was accepted")
    assert await runs.events(heir.id) == []


async def test_the_handler_moves_the_domain_row_with_the_take_back(
    runs: AgentRuns, reaper: AgentRunReaper, backend: Backend
) -> None:
    run = await runs.enqueue("review", workspace="acme", subject="review:9")
    await runs.claim("w")
    backend.clock.advance(LEASE)
    await reaper.tick()
    async with backend.stores.scope.transaction() as tx:
        job = await backend.review_jobs.get(tx, run.id)
    assert job is not None
    assert (job.status, job.attempt) == (ReviewStatus.QUEUED, 1)


async def test_a_take_back_that_fails_is_skipped_and_the_others_go_on(
    backend: Backend, rng: random.Random
) -> None:
    seen_by_handler: list[AgentRunState] = []

    class Fragile(NoDomainRow):
        @property
        def has_domain_row(self) -> bool:
            return True  # its take-back hook must run

        async def on_take_back(self, tx: Transaction, run: AgentRun, change: RunChange) -> None:
            seen_by_handler.append(run.state)
            if run.subject == "broken":
                raise RuntimeError("domain row is corrupt")

    kinds = RunKinds([RunKind(policy("fragile"), scripted_steps, Fragile())])
    runs = AgentRuns(backend.stores, kinds, rng)
    reaper = AgentRunReaper(backend.stores, kinds, rng)
    broken = await runs.enqueue("fragile", workspace="acme", subject="broken")
    fine = await runs.enqueue("fragile", workspace="acme", subject="fine")
    await runs.claim("w", limit=2)
    backend.clock.advance(LEASE)
    report = await reaper.tick()
    assert (report.taken_back, report.failed) == (1, 1)
    assert (await runs.get(fine.id)).state is AgentRunState.QUEUED
    assert (await runs.get(broken.id)).state is AgentRunState.LEASED
    assert seen_by_handler == [AgentRunState.LEASED, AgentRunState.LEASED]


async def test_two_reapers_take_a_lease_back_once(
    runs: AgentRuns, kinds: RunKinds, backend: Backend
) -> None:
    import asyncio

    run = await runs.enqueue("chat", workspace="acme", subject="c")
    await runs.claim("w")
    backend.clock.advance(LEASE)
    first = AgentRunReaper(backend.stores, kinds, random.Random(1))
    second = AgentRunReaper(backend.stores, kinds, random.Random(2))
    reports = await asyncio.gather(first.tick(), second.tick())
    assert sum(report.taken_back for report in reports) == 1
    assert (await runs.get(run.id)).attempt == 1


async def test_expired_leases_of_kinds_without_a_domain_row_are_taken_back_as_a_batch(
    runs: AgentRuns, kinds: RunKinds, backend: Backend, rng: random.Random
) -> None:
    """One tick takes back a whole batch: each run requeued once, or ended at its budget."""
    enqueued = [
        await runs.enqueue("chat", workspace=f"ws-{n % 3}", subject=f"s-{n}") for n in range(30)
    ]
    assert len(await runs.claim("w", limit=30)) == 30
    backend.clock.advance(LEASE)
    report = await AgentRunReaper(backend.stores, kinds, rng, batch=100).tick()
    assert (report.taken_back, report.requeued, report.lost_races) == (30, 30, 0)
    for run in enqueued:
        after = await runs.get(run.id)
        assert (after.state, after.attempt, after.holder) == (AgentRunState.QUEUED, 1, None)
        assert after.due_at > backend.clock.now()  # after the kind's backoff


async def test_a_renewal_that_committed_first_keeps_its_run_out_of_the_batch(
    runs: AgentRuns, kinds: RunKinds, backend: Backend, rng: random.Random
) -> None:
    """The batch is conditional per row: a run renewed before the take-back stays leased."""
    for n in range(3):
        await runs.enqueue("chat", workspace="acme", subject=f"s-{n}")
    claimed = await runs.claim("w", limit=3)
    backend.clock.advance(LEASE - timedelta(seconds=1))
    kept = claimed[1]
    await runs.renew(kept.fence)
    backend.clock.advance(timedelta(seconds=1))
    report = await AgentRunReaper(backend.stores, kinds, rng).tick()
    assert report.taken_back == 2
    assert (await runs.get(kept.id)).state is AgentRunState.LEASED
