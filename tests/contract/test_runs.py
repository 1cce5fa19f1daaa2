"""AgentRuns on every backend: enqueue, claim, fence, settle, cancel, continue, purge."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.ports import BudgetHold
from agentruns.app.runs import AgentRuns
from agentruns.domain.bands import Band
from agentruns.domain.errors import (
    IllegalTransition,
    InvalidBand,
    InvalidPayload,
    InvalidRequest,
    LeaseExpired,
    RetryBudgetExhausted,
    RunNotFound,
    StaleEpoch,
    UnknownKind,
)
from agentruns.domain.run import AgentRunFence
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from examples.review import ReviewStatus
from tests.contract.conftest import Backend
from tests.contract.kinds import LEASE, policy, scripted_steps


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"kind": "nope"}, UnknownKind),
        ({"band": "urgent"}, InvalidBand),
        ({"payload": ["not", "an", "object"]}, InvalidPayload),
        ({"payload": {"when": datetime(2026, 1, 1, tzinfo=UTC)}}, InvalidPayload),
        ({"workspace": ""}, InvalidRequest),
        ({"subject": "   "}, InvalidRequest),
        ({"due_at": datetime(2026, 1, 1)}, InvalidRequest),
    ],
)
async def test_bad_input_is_refused_and_nothing_is_written(
    runs: AgentRuns, changes: dict[str, object], error: type[Exception]
) -> None:
    request: dict[str, object] = {
        "kind": "chat",
        "workspace": "acme",
        "subject": "conversation:1",
        "payload": {"steps": 1},
    }
    request.update(changes)
    kind = request.pop("kind")
    with pytest.raises(error):
        await runs.enqueue(kind, **request)  # type: ignore[arg-type]
    assert await runs.claim("w", limit=10) == []


async def test_ids_between_is_the_range_of_an_id_prefix_in_uuid_order(
    runs: AgentRuns, backend: Backend
) -> None:
    """As ``runs show PREFIX`` asks it: PostgreSQL's uuid order is the memory adapter's."""
    ids = sorted(
        [(await runs.enqueue("chat", workspace="acme", subject=f"s{n}")).id for n in range(30)]
    )
    low, high = ids[3], ids[20]
    async with backend.stores.scope.transaction() as tx:
        assert await backend.stores.runs.ids_between(tx, low, high, 100) == ids[3:21]
        assert await backend.stores.runs.ids_between(tx, low, high, 2) == ids[3:5]
        digit = str(ids[0])[0]
        prefix = [run_id for run_id in ids if str(run_id).startswith(digit)]
        low, high = (UUID(digit.ljust(32, fill)) for fill in "0f")
        assert await backend.stores.runs.ids_between(tx, low, high, 100) == prefix
        assert await backend.stores.runs.ids_between(tx, high, low, 100) == []


async def test_an_enqueued_run_is_queued_and_due_now(runs: AgentRuns, backend: Backend) -> None:
    run = await runs.enqueue("chat", workspace="acme", subject="c:1", payload={"steps": 1})
    assert run.state is AgentRunState.QUEUED
    assert (run.epoch, run.attempt) == (0, 0)
    assert run.due_at == backend.clock.now()
    assert run.lease == LEASE
    assert (await runs.get(run.id)).payload == {"steps": 1}


async def test_a_claim_leases_the_due_run_under_the_next_epoch(
    runs: AgentRuns, backend: Backend
) -> None:
    run = await runs.enqueue("chat", workspace="acme", subject="c:1")
    [claimed] = await runs.claim("w1")
    assert claimed.id == run.id
    assert (claimed.state, claimed.epoch, claimed.attempt) == (AgentRunState.LEASED, 1, 0)
    assert claimed.holder == "w1"
    assert claimed.leased_until == backend.clock.now() + LEASE
    assert await runs.claim("w2") == []


async def test_a_run_that_is_not_due_is_not_claimed(runs: AgentRuns, backend: Backend) -> None:
    later = backend.clock.now() + timedelta(minutes=5)
    await runs.enqueue("chat", workspace="acme", subject="c:1", due_at=later)
    assert await runs.claim("w") == []
    backend.clock.set(later)
    assert len(await runs.claim("w")) == 1


async def test_a_subject_has_at_most_one_leased_run_and_keeps_queue_order(
    runs: AgentRuns,
) -> None:
    first = await runs.enqueue("chat", workspace="acme", subject="c:1")
    second = await runs.enqueue("chat", workspace="acme", subject="c:1")
    claimed = await runs.claim("w", limit=10)
    assert [run.id for run in claimed] == [first.id]
    await runs.end(claimed[0].fence, TerminationReason.COMPLETED)
    [next_run] = await runs.claim("w", limit=10)
    assert next_run.id == second.id


async def test_a_claimer_of_one_kind_does_not_overtake_another_kind_on_a_subject(
    runs: AgentRuns,
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="s")
    await runs.enqueue("review", workspace="acme", subject="s")
    assert await runs.claim("w", kinds=["review"]) == []
    assert [r.kind for r in await runs.claim("w", kinds=["chat"])] == ["chat"]


async def test_interactive_goes_before_batch_and_batch_before_background(
    runs: AgentRuns,
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="a", band=Band.BACKGROUND)
    await runs.enqueue("chat", workspace="acme", subject="b", band=Band.BATCH)
    await runs.enqueue("chat", workspace="acme", subject="c", band="interactive")
    claimed = await runs.claim("w", limit=3)
    assert [run.subject for run in claimed] == ["c", "b", "a"]


async def test_a_background_run_that_waited_ages_into_batch_but_never_interactive(
    runs: AgentRuns, backend: Backend
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="old", band=Band.BACKGROUND)
    backend.clock.advance(timedelta(minutes=10))
    await runs.enqueue("chat", workspace="acme", subject="new", band=Band.BATCH)
    await runs.enqueue("chat", workspace="acme", subject="person", band=Band.INTERACTIVE)
    claimed = await runs.claim("w", limit=3)
    assert [run.subject for run in claimed] == ["person", "old", "new"]


async def test_the_workspace_with_fewer_leased_runs_goes_first(runs: AgentRuns) -> None:
    await runs.enqueue("chat", workspace="busy", subject="b1")
    await runs.enqueue("chat", workspace="busy", subject="b2")
    await runs.enqueue("chat", workspace="busy", subject="b3")
    await runs.enqueue("chat", workspace="quiet", subject="q1")
    await runs.enqueue("chat", workspace="quiet", subject="q2")
    [first] = await runs.claim("w")
    assert first.subject == "b1"  # equal load: the oldest
    batch = await runs.claim("w", limit=4)
    assert [run.subject for run in batch] == ["q1", "b2", "q2", "b3"]


async def test_runs_of_an_inactive_workspace_are_not_offered(runs: AgentRuns) -> None:
    await runs.enqueue("chat", workspace="paused", subject="p")
    await runs.set_workspace_active("paused", False)
    assert await runs.claim("w") == []
    await runs.set_workspace_active("paused", True)
    assert len(await runs.claim("w")) == 1


async def test_a_budget_hold_keeps_a_workspace_waiting_until_it_ends(
    runs: AgentRuns, backend: Backend
) -> None:
    await runs.enqueue("chat", workspace="broke", subject="x")
    await runs.hold_budget(BudgetHold("broke", backend.clock.now() + timedelta(minutes=1)))
    assert await runs.claim("w") == []
    backend.clock.advance(timedelta(minutes=1))
    assert len(await runs.claim("w")) == 1


async def test_a_claim_that_a_budget_holds_rolls_back_and_spends_nothing(
    backend: Backend, rng: object
) -> None:
    """The kind's budget check at claim time rolls the claim back; the run waits for the hold."""
    from agentruns.app.kinds import NoDomainRow, RunKind, RunKinds
    from agentruns.app.ports import Transaction
    from agentruns.domain.run import AgentRun
    from tests.contract.kinds import policy, scripted_steps

    class Budgeted(NoDomainRow):
        async def check_budget(self, tx: Transaction, run: AgentRun) -> BudgetHold | None:
            if run.workspace == "broke":
                return BudgetHold("broke", backend.clock.now() + timedelta(minutes=5), "spent")
            return None

    import random

    runs = AgentRuns(
        backend.stores,
        RunKinds([RunKind(policy("metered"), scripted_steps, Budgeted())]),
        random.Random(1),
    )
    held = await runs.enqueue("metered", workspace="broke", subject="h")
    free = await runs.enqueue("metered", workspace="fine", subject="f")
    claimed = await runs.claim("w", limit=2)
    assert [run.id for run in claimed] == [free.id]
    waiting = await runs.get(held.id)
    assert (waiting.state, waiting.epoch, waiting.attempt) == (AgentRunState.QUEUED, 0, 0)
    async with backend.stores.scope.transaction() as tx:
        holds = await backend.stores.workspaces.holds(tx)
    assert [hold.workspace for hold in holds] == ["broke"]


async def test_claim_subject_leases_only_that_subject_and_those_kinds(runs: AgentRuns) -> None:
    await runs.enqueue("chat", workspace="acme", subject="other")
    await runs.enqueue("review", workspace="acme", subject="mine")
    assert await runs.claim_subject("sandbox", "acme", "mine", kinds=["chat"]) is None
    claimed = await runs.claim_subject("sandbox", "acme", "mine", kinds=["review", "chat"])
    assert claimed is not None
    assert (claimed.subject, claimed.kind) == ("mine", "review")


async def test_a_renewal_extends_the_lease_and_keeps_the_epoch(
    runs: AgentRuns, backend: Backend
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    backend.clock.advance(timedelta(seconds=20))
    renewed = await runs.renew(run.fence)
    assert renewed.leased_until == backend.clock.now() + LEASE
    assert renewed.epoch == run.epoch


async def test_an_expired_lease_refuses_renewal_whatever_its_epoch(
    runs: AgentRuns, backend: Backend
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    backend.clock.advance(LEASE)
    with pytest.raises(LeaseExpired):
        await runs.renew(run.fence)
    with pytest.raises(LeaseExpired):
        async with backend.stores.scope.transaction() as tx:
            await runs.require_current(tx, run.fence)


async def test_a_stale_epoch_is_refused_every_write(
    runs: AgentRuns, backend: Backend, reaper: object
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [first] = await runs.claim("w1")
    await runs.requeue(first.fence, charged=False, delay=timedelta(0))
    [second] = await runs.claim("w2")
    assert second.epoch == first.epoch + 1
    stale = first.fence
    for write in (
        runs.renew(stale),
        runs.end(stale, TerminationReason.COMPLETED),
        runs.requeue(stale, charged=True),
        runs.append_event(stale, "step", {"zombie": True}),
    ):
        with pytest.raises(StaleEpoch):
            await write
    assert await runs.events(second.id) == []
    assert (await runs.get(second.id)).state is AgentRunState.LEASED


async def test_a_fence_of_an_unknown_run_is_refused(runs: AgentRuns) -> None:
    with pytest.raises(RunNotFound):
        await runs.renew(AgentRunFence(uuid4(), "acme", 1))


async def test_events_are_appended_in_order_under_the_fence(runs: AgentRuns) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    await runs.append_event(run.fence, "plan", {"n": 1})
    await runs.append_event(run.fence, "act", {"n": 2})
    events = await runs.events(run.id)
    assert [(e.seq, e.epoch, e.type, e.data) for e in events] == [
        (1, 1, "plan", {"n": 1}),
        (2, 1, "act", {"n": 2}),
    ]


async def test_a_step_boundary_renews_the_lease_and_appends_in_order(
    runs: AgentRuns, backend: Backend
) -> None:
    """One step boundary pushes the lease and appends the event, numbered after the others."""
    await runs.enqueue("chat", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    await runs.append_event(run.fence, "plan", {"n": 1})
    backend.clock.advance(LEASE / 2)
    event = await runs.step_boundary(run.fence, "act", {"n": 2})
    assert (event.run_id, event.seq, event.epoch, event.type, event.data) == (
        run.id,
        2,
        1,
        "act",
        {"n": 2},
    )
    renewed = await runs.get(run.id)
    assert renewed.leased_until == backend.clock.now() + LEASE
    assert [e.seq for e in await runs.events(run.id)] == [1, 2]


async def test_a_step_boundary_under_a_lost_fence_appends_nothing(
    runs: AgentRuns, backend: Backend
) -> None:
    """A stale epoch, an expired lease and an unknown run each refuse the whole boundary."""
    await runs.enqueue("chat", workspace="acme", subject="c")
    [first] = await runs.claim("w1")
    await runs.requeue(first.fence, charged=False, delay=timedelta(0))
    [second] = await runs.claim("w2")
    with pytest.raises(StaleEpoch):
        await runs.step_boundary(first.fence, "step", {"zombie": True})
    with pytest.raises(RunNotFound):
        await runs.step_boundary(AgentRunFence(uuid4(), "acme", 1), "step")
    backend.clock.advance(LEASE * 2)
    with pytest.raises(LeaseExpired):
        await runs.step_boundary(second.fence, "step", {"late": True})
    assert await runs.events(second.id) == []
    assert (await runs.get(second.id)).leased_until == second.leased_until


def _without_domain_rows(backend: Backend, rng: random.Random) -> AgentRuns:
    """AgentRuns over kinds none of which keeps a domain row: settles skip the run's read."""
    kinds = RunKinds([RunKind(policy("chat"), scripted_steps)])
    assert not kinds.any_domain_rows
    return AgentRuns(backend.stores, kinds, rng)


async def test_an_end_without_domain_rows_settles_under_the_fence(
    backend: Backend, rng: random.Random
) -> None:
    """With no domain row to lock first, an end still holds its fence and settles the run."""
    runs = _without_domain_rows(backend, rng)
    await runs.enqueue("chat", workspace="acme", subject="c")
    [first] = await runs.claim("w1")
    await runs.requeue(first.fence, charged=False, delay=timedelta(0))
    [second] = await runs.claim("w2")
    with pytest.raises(StaleEpoch):
        await runs.end(first.fence, TerminationReason.COMPLETED)
    with pytest.raises(RunNotFound):
        await runs.end(AgentRunFence(uuid4(), "acme", 1), TerminationReason.COMPLETED)
    ended = await runs.end(second.fence, TerminationReason.COMPLETED)
    assert (ended.state, ended.epoch) == (AgentRunState.ENDED, second.epoch)
    backend.clock.advance(LEASE * 2)
    await runs.enqueue("chat", workspace="acme", subject="d")
    [late] = await runs.claim("w3")
    backend.clock.advance(LEASE * 2)
    with pytest.raises(LeaseExpired):
        await runs.end(late.fence, TerminationReason.COMPLETED)
    assert (await runs.get(late.id)).state is AgentRunState.LEASED


async def test_an_end_without_domain_rows_refuses_a_run_of_an_unknown_kind(
    runs: AgentRuns, backend: Backend, rng: random.Random
) -> None:
    """A process that does not know the run's kind refuses to settle it and writes nothing."""
    await runs.enqueue("sweep", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    with pytest.raises(UnknownKind):
        await _without_domain_rows(backend, rng).end(run.fence, TerminationReason.COMPLETED)
    assert (await runs.get(run.id)).state is AgentRunState.LEASED


def test_kinds_say_whether_any_keeps_a_domain_row(kinds: RunKinds) -> None:
    """The contract kinds include the review kind, whose handler keeps a review job row."""
    assert kinds.any_domain_rows
    assert not RunKinds().any_domain_rows


async def test_an_end_settles_the_run_and_an_ended_run_never_moves(runs: AgentRuns) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    ended = await runs.end(run.fence, TerminationReason.COMPLETED)
    assert (ended.state, ended.end_reason) == (AgentRunState.ENDED, TerminationReason.COMPLETED)
    assert ended.ended_at is not None
    with pytest.raises(StaleEpoch):
        await runs.end(run.fence, TerminationReason.FAILED)
    with pytest.raises(IllegalTransition):
        await runs.cancel(run.id)
    assert (await runs.get(run.id)).end_reason is TerminationReason.COMPLETED


async def test_a_charged_requeue_spends_an_attempt_and_waits_its_backoff(
    runs: AgentRuns, backend: Backend
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    requeued = await runs.requeue(run.fence, charged=True)
    assert (requeued.state, requeued.attempt, requeued.epoch) == (AgentRunState.QUEUED, 1, 1)
    assert requeued.due_at == backend.clock.now() + timedelta(seconds=10)
    assert requeued.holder is None
    assert await runs.claim("w") == []


async def test_an_uncharged_requeue_spends_nothing(runs: AgentRuns) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    requeued = await runs.requeue(run.fence, charged=False, delay=timedelta(0))
    assert requeued.attempt == 0
    [again] = await runs.claim("w")
    assert again.epoch == 2


async def test_a_charged_requeue_past_the_budget_is_refused(runs: AgentRuns) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    for _ in range(3):
        [run] = await runs.claim("w")
        await runs.requeue(run.fence, charged=True, delay=timedelta(0))
    [run] = await runs.claim("w")
    assert run.attempt == 3
    with pytest.raises(RetryBudgetExhausted):
        await runs.requeue(run.fence, charged=True, delay=timedelta(0))
    assert (await runs.get(run.id)).state is AgentRunState.LEASED


async def test_cancelling_a_queued_run_ends_it_at_once(runs: AgentRuns) -> None:
    run = await runs.enqueue("chat", workspace="acme", subject="c")
    cancelled = await runs.cancel(run.id)
    assert cancelled.end_reason is TerminationReason.CANCELLED
    assert await runs.claim("w") == []


async def test_cancelling_a_leased_run_makes_its_holder_lose_the_lease(runs: AgentRuns) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c")
    [run] = await runs.claim("w")
    await runs.cancel(run.id)
    with pytest.raises(StaleEpoch):
        await runs.renew(run.fence)


async def test_cancelling_an_unknown_run_is_refused(runs: AgentRuns) -> None:
    with pytest.raises(RunNotFound):
        await runs.cancel(uuid4())


async def test_continue_after_goes_on_with_the_epochs_and_one_more_attempt(
    runs: AgentRuns,
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c", payload={"turn": 1})
    [run] = await runs.claim("w")
    await runs.end(run.fence, TerminationReason.COMPLETED)
    follow = await runs.continue_after(run.id, payload={"turn": 2})
    assert (follow.epoch, follow.attempt, follow.continues) == (1, 1, run.id)
    assert (follow.kind, follow.workspace, follow.subject) == ("chat", "acme", "c")
    [claimed] = await runs.claim("w")
    assert claimed.id == follow.id
    assert claimed.epoch == 2


async def test_continue_after_is_bounded_by_the_retry_budget(runs: AgentRuns) -> None:
    current = await runs.enqueue("chat", workspace="acme", subject="c")
    for _ in range(3):
        [run] = await runs.claim("w")
        await runs.end(run.fence, TerminationReason.COMPLETED)
        current = await runs.continue_after(run.id)
    [run] = await runs.claim("w")
    await runs.end(run.fence, TerminationReason.COMPLETED)
    with pytest.raises(RetryBudgetExhausted):
        await runs.continue_after(current.id)
    with pytest.raises(IllegalTransition):
        await runs.continue_after((await runs.enqueue("chat", workspace="a", subject="d")).id)


async def test_purge_deletes_runs_ended_before_the_retention(
    runs: AgentRuns, backend: Backend
) -> None:
    old = await runs.enqueue("chat", workspace="acme", subject="a")
    await runs.cancel(old.id)
    backend.clock.advance(timedelta(days=8))
    recent = await runs.enqueue("chat", workspace="acme", subject="b")
    await runs.cancel(recent.id)
    waiting = await runs.enqueue("chat", workspace="acme", subject="c")
    assert await runs.purge(timedelta(days=7)) == 1
    with pytest.raises(RunNotFound):
        await runs.get(old.id)
    assert (await runs.get(recent.id)).state is AgentRunState.ENDED
    assert (await runs.get(waiting.id)).state is AgentRunState.QUEUED


async def test_an_enqueue_wakes_an_idle_claimer(runs: AgentRuns, backend: Backend) -> None:
    import asyncio

    waiter = asyncio.create_task(backend.stores.notifier.wait(30.0))
    await asyncio.sleep(0.05)
    await runs.enqueue("chat", workspace="acme", subject="c")
    async with asyncio.timeout(10):
        assert await waiter is True


async def test_a_review_job_agrees_with_its_run_through_its_life(
    runs: AgentRuns, backend: Backend
) -> None:
    async def job_status() -> tuple[ReviewStatus, int]:
        async with backend.stores.scope.transaction() as tx:
            job = await backend.review_jobs.get(tx, run.id)
        assert job is not None
        return job.status, job.attempt

    run = await runs.enqueue("review", workspace="acme", subject="review:1")
    assert await job_status() == (ReviewStatus.QUEUED, 0)
    [leased] = await runs.claim("w")
    assert await job_status() == (ReviewStatus.RUNNING, 0)
    await runs.requeue(leased.fence, charged=True, delay=timedelta(0))
    assert await job_status() == (ReviewStatus.QUEUED, 1)
    [again] = await runs.claim("w")
    assert await job_status() == (ReviewStatus.RUNNING, 1)
    await runs.end(again.fence, TerminationReason.COMPLETED)
    assert await job_status() == (ReviewStatus.ENDED, 2)
