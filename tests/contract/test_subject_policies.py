"""Subject policies on every backend (ADRs/0028): what an enqueue does when its subject has a
run that has not ended: queue behind it, reject, or interrupt it."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.recorded import RecordedSteps
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.errors import InvalidRequest, SubjectBusy
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.subject_policy import OnActive
from agentruns.domain.termination import RunOutcome, TerminationReason
from examples.review import ReviewStatus
from tests.contract.conftest import Backend
from tests.contract.kinds import policy, scripted_steps
from tests.contract.test_cancel_step import PROMPT, Calls, _outcome, cancelling_worker
from tests.contract.test_worker import BOUND, within


async def _subject(runs: AgentRuns, subject: str = "c:1") -> list[AgentRun]:
    """The subject's runs in queue order."""
    page = await runs.list_runs(workspace="acme", subject=subject, limit=100)
    return sorted(page.runs, key=lambda run: run.seq)


async def test_queue_is_the_default_and_queues_behind_the_active_run(runs: AgentRuns) -> None:
    first = await runs.enqueue("chat", workspace="acme", subject="c:1")
    second = await runs.enqueue("chat", workspace="acme", subject="c:1")
    third = await runs.enqueue("chat", workspace="acme", subject="c:1", on_active="queue")
    assert [run.id for run in await _subject(runs)] == [first.id, second.id, third.id]
    assert all(run.state is AgentRunState.QUEUED for run in await _subject(runs))


@pytest.mark.parametrize("leased", [False, True], ids=["queued", "leased"])
async def test_reject_names_the_active_run_and_writes_nothing(
    runs: AgentRuns, leased: bool
) -> None:
    active = await runs.enqueue("chat", workspace="acme", subject="c:1")
    if leased:
        [claimed] = await runs.claim("w")
        assert claimed.id == active.id
    with pytest.raises(SubjectBusy, match=str(active.id)) as refused:
        await runs.enqueue("chat", workspace="acme", subject="c:1", on_active=OnActive.REJECT)
    assert refused.value.run_id == active.id
    assert isinstance(refused.value, InvalidRequest)
    assert [run.id for run in await _subject(runs)] == [active.id]
    state = AgentRunState.LEASED if leased else AgentRunState.QUEUED
    assert (await runs.get(active.id)).state is state


async def test_reject_and_interrupt_on_an_idle_subject_enqueue(runs: AgentRuns) -> None:
    """Ended runs are not active: the subject is idle, and the new run is queued."""
    old = await runs.enqueue("chat", workspace="acme", subject="c:1")
    await runs.cancel(old.id)
    rejected_not = await runs.enqueue("chat", workspace="acme", subject="c:1", on_active="reject")
    other = await runs.enqueue("chat", workspace="acme", subject="c:2", on_active="interrupt")
    assert rejected_not.state is AgentRunState.QUEUED
    assert other.state is AgentRunState.QUEUED
    assert (await runs.get(old.id)).end_reason is TerminationReason.CANCELLED


async def test_interrupt_ends_every_active_run_and_the_new_run_is_next(runs: AgentRuns) -> None:
    leased_run = await runs.enqueue("chat", workspace="acme", subject="c:1")
    [leased] = await runs.claim("w")
    assert leased.id == leased_run.id
    waiting = await runs.enqueue("chat", workspace="acme", subject="c:1")
    new = await runs.enqueue(
        "chat", workspace="acme", subject="c:1", on_active="interrupt", payload={"m": 3}
    )
    for run_id in (leased.id, waiting.id):
        ended = await runs.get(run_id)
        assert ended.state is AgentRunState.ENDED
        assert ended.end_reason is TerminationReason.CANCELLED
    [claimed] = await runs.claim("w")
    assert claimed.id == new.id
    assert claimed.payload == {"m": 3}


async def test_the_kind_s_policy_is_the_default_and_an_enqueue_overrides_it(
    runs: AgentRuns, kinds: RunKinds
) -> None:
    kinds.register(RunKind(policy("solo", on_active=OnActive.REJECT), scripted_steps))
    first = await runs.enqueue("solo", workspace="acme", subject="c:1")
    with pytest.raises(SubjectBusy):
        await runs.enqueue("solo", workspace="acme", subject="c:1")
    queued = await runs.enqueue("solo", workspace="acme", subject="c:1", on_active="queue")
    assert [run.id for run in await _subject(runs)] == [first.id, queued.id]


async def test_an_unknown_policy_is_refused(runs: AgentRuns) -> None:
    with pytest.raises(InvalidRequest, match="on_active is one of queue, reject, interrupt"):
        await runs.enqueue("chat", workspace="acme", subject="c:1", on_active="rollback")
    with pytest.raises(InvalidRequest, match="on_active"):
        policy("chat", on_active="sometimes")
    assert await _subject(runs) == []


@pytest.mark.parametrize("on_active", [OnActive.REJECT, OnActive.INTERRUPT])
async def test_a_held_key_is_looked_up_before_the_policy(
    runs: AgentRuns, on_active: OnActive
) -> None:
    """A retried enqueue with its key finds its own run, neither rejected nor interrupted."""
    first = await runs.enqueue_once(
        "chat", workspace="acme", subject="c:1", key="m-1", on_active=on_active
    )
    [leased] = await runs.claim("w")
    again = await runs.enqueue_once(
        "chat", workspace="acme", subject="c:1", key="m-1", on_active=on_active
    )
    assert first.created
    assert not again.created
    assert again.run.id == first.run.id == leased.id
    assert (await runs.get(leased.id)).state is AgentRunState.LEASED
    if on_active is OnActive.INTERRUPT:
        second = await runs.enqueue_once(
            "chat", workspace="acme", subject="c:1", key="m-2", on_active=on_active
        )
        assert second.created
        assert (await runs.get(leased.id)).end_reason is TerminationReason.CANCELLED
    else:
        with pytest.raises(SubjectBusy):
            await runs.enqueue_once(
                "chat", workspace="acme", subject="c:1", key="m-2", on_active=on_active
            )


async def test_interrupt_in_the_caller_s_transaction_rolls_back_with_it(
    runs: AgentRuns,
) -> None:
    active = await runs.enqueue("chat", workspace="acme", subject="c:1")

    async def interrupt_then_fail() -> None:
        async with runs.transaction() as tx:
            await runs.enqueue(
                "chat", workspace="acme", subject="c:1", on_active="interrupt", tx=tx
            )
            raise RuntimeError("the host's own write failed")

    with pytest.raises(RuntimeError):
        await interrupt_then_fail()
    assert [run.id for run in await _subject(runs)] == [active.id]
    assert (await runs.get(active.id)).state is AgentRunState.QUEUED


async def test_interrupt_moves_the_interrupted_run_s_domain_row(
    runs: AgentRuns, backend: Backend
) -> None:
    old = await runs.enqueue("review", workspace="acme", subject="review:1")
    await runs.claim("w")
    new = await runs.enqueue("review", workspace="acme", subject="review:1", on_active="interrupt")
    async with backend.stores.scope.transaction() as tx:
        old_job = await backend.review_jobs.get(tx, old.id)
        new_job = await backend.review_jobs.get(tx, new.id)
    assert old_job is not None
    assert old_job.status is ReviewStatus.ENDED
    assert new_job is not None
    assert new_job.status is ReviewStatus.QUEUED


async def test_interrupt_reaches_the_running_step_and_the_new_run_runs_next(
    runs: AgentRuns, kinds: RunKinds, backend: Backend
) -> None:
    """The holder's step sees CancelledError promptly (ADRs/0023), the old run ends cancelled
    with the step it had recorded, and the worker then takes the new run."""
    calls = Calls()
    kinds.register(RunKind(policy("calls"), RecordedSteps(calls.steps)))
    worker = cancelling_worker(runs, kinds, backend)
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run(stop, grace=BOUND))
    try:
        old = await runs.enqueue("calls", workspace="acme", subject="s")
        await within(calls.calling.wait())
        calls.calling.clear()
        asked = time.perf_counter()
        new = await runs.enqueue("calls", workspace="acme", subject="s", on_active="interrupt")
        await within(_outcome(worker, RunOutcome.CANCELLED))
        [reached] = calls.cancelled
        assert reached - asked < PROMPT
        await within(calls.calling.wait())  # the new run's call is running now
        assert (await runs.get(new.id)).state is AgentRunState.LEASED
        await runs.cancel(new.id)  # its call would wait for ever
        await within(_outcomes(worker, RunOutcome.CANCELLED, 2))
    finally:
        stop.set()
        await within(loop)
    ended = await runs.get(old.id)
    assert ended.end_reason is TerminationReason.CANCELLED
    assert [event.data["name"] for event in await runs.events(old.id)] == ["plan"]


async def _outcomes(worker: Worker, outcome: RunOutcome, count: int) -> None:
    """Until the worker has ended ``count`` runs with ``outcome`` (looked at every 5 ms)."""
    for _ in range(int(BOUND / 0.005)):
        if worker.stats.outcomes.get(outcome, 0) >= count:
            return
        await asyncio.sleep(0.005)


async def test_interrupts_racing_leave_one_active_run(runs: AgentRuns) -> None:
    """Many interrupts of one subject at once: each ends the one before, one run is left."""
    await runs.enqueue("chat", workspace="acme", subject="c:1")
    made = await asyncio.gather(
        *(
            runs.enqueue("chat", workspace="acme", subject="c:1", on_active="interrupt")
            for _ in range(8)
        )
    )
    alive = [run for run in await _subject(runs) if run.state is not AgentRunState.ENDED]
    assert len(alive) == 1
    assert alive[0].id in {run.id for run in made}
    assert len(await _subject(runs)) == 9


async def test_rejects_racing_an_idle_subject_make_one_run(runs: AgentRuns) -> None:
    results = await asyncio.gather(
        *(
            runs.enqueue("chat", workspace="acme", subject="c:1", on_active="reject")
            for _ in range(8)
        ),
        return_exceptions=True,
    )
    made = [result for result in results if isinstance(result, AgentRun)]
    refused = [result for result in results if isinstance(result, SubjectBusy)]
    assert len(made) == 1
    assert len(refused) == 7
    assert {error.run_id for error in refused} == {made[0].id}


def test_policies_parse_by_name() -> None:
    assert OnActive.parse("Interrupt") is OnActive.INTERRUPT
    assert random.choice(list(OnActive)) in OnActive
