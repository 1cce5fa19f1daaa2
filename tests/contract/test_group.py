"""Group commit on every backend: step boundaries and ends of several runs in one transaction."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from uuid import uuid4

import pytest

from agentruns.app.kinds import RunKinds
from agentruns.app.ports import EndWrite, RunEvent, StepWrite
from agentruns.app.runs import AgentRuns
from agentruns.app.settler import GroupSettler
from agentruns.app.worker import Worker
from agentruns.domain.errors import (
    InvalidPayload,
    InvalidRequest,
    LeaseExpired,
    RunNotFound,
    StaleEpoch,
)
from agentruns.domain.run import AgentRun, AgentRunFence
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome, TerminationReason
from tests.contract.conftest import Backend
from tests.contract.kinds import LEASE


async def _leased(runs: AgentRuns, count: int) -> list[AgentRun]:
    for index in range(count):
        await runs.enqueue("chat", workspace="acme", subject=f"s-{index}")
    return await runs.claim("w", limit=count)


async def _stale(runs: AgentRuns) -> tuple[AgentRunFence, AgentRun]:
    """A fence one claim behind, and the run as its new holder leased it."""
    await runs.enqueue("chat", workspace="acme", subject="stale")
    [first] = await runs.claim("old")
    await runs.requeue(first.fence, charged=False, delay=timedelta(0))
    [second] = await runs.claim("new")
    return first.fence, second


async def test_a_group_with_one_stale_fence_commits_the_others_and_appends_nothing_for_it(
    runs: AgentRuns,
) -> None:
    """The stale write is refused alone: the others renew and append, the stale run has no
    event and keeps its new holder's lease."""
    stale, taken = await _stale(runs)
    held = await _leased(runs, 2)
    results = await runs.settle_group(
        [
            StepWrite(held[0].fence, "step", {"n": 0}),
            StepWrite(stale, "step", {"zombie": True}),
            StepWrite(held[1].fence, "step", {"n": 1}),
        ]
    )
    assert isinstance(results[1], StaleEpoch)
    for run, result in zip(held, (results[0], results[2]), strict=True):
        assert isinstance(result, RunEvent)
        assert (result.run_id, result.seq, result.epoch) == (run.id, 1, run.epoch)
        assert [e.data for e in await runs.events(run.id)] == [result.data]
    assert await runs.events(taken.id) == []
    after = await runs.get(taken.id)
    assert (after.state, after.epoch, after.leased_until) == (
        AgentRunState.LEASED,
        taken.epoch,
        taken.leased_until,
    )


async def test_a_group_renews_each_lease_on_the_store_clock(
    runs: AgentRuns, backend: Backend
) -> None:
    """Each step boundary of a group pushes its run's lease, as a lone boundary would."""
    held = await _leased(runs, 3)
    backend.clock.advance(LEASE / 2)
    await runs.settle_group([StepWrite(run.fence, "step", {}) for run in held])
    for run in held:
        assert (await runs.get(run.id)).leased_until == backend.clock.now() + LEASE


async def test_a_group_of_ends_settles_the_held_and_refuses_each_lost_fence_alone(
    runs: AgentRuns, backend: Backend
) -> None:
    """Ends: the held runs end; a stale epoch, an expired lease and an unknown run are each
    refused with the error a lone end raises, and their runs do not move."""
    stale, taken = await _stale(runs)
    [expiring] = await _leased(runs, 1)
    backend.clock.advance(LEASE * 2)
    for index in range(2):
        await runs.enqueue("chat", workspace="acme", subject=f"t-{index}")
    held = await runs.claim("w2", limit=2)
    unknown = AgentRunFence(uuid4(), "acme", 1)
    results = await runs.settle_group(
        [
            EndWrite(held[0].fence, TerminationReason.COMPLETED),
            EndWrite(stale, TerminationReason.COMPLETED),
            EndWrite(expiring.fence, TerminationReason.COMPLETED),
            EndWrite(unknown, TerminationReason.COMPLETED),
            EndWrite(held[1].fence, TerminationReason.NOT_RETRYABLE),
        ]
    )
    assert [type(result) for result in results[1:4]] == [StaleEpoch, LeaseExpired, RunNotFound]
    for run, result, reason in (
        (held[0], results[0], TerminationReason.COMPLETED),
        (held[1], results[4], TerminationReason.NOT_RETRYABLE),
    ):
        assert isinstance(result, AgentRun)
        assert (result.id, result.state, result.end_reason) == (run.id, AgentRunState.ENDED, reason)
        assert (await runs.get(run.id)).state is AgentRunState.ENDED
    assert (await runs.get(expiring.id)).state is AgentRunState.LEASED
    assert (await runs.get(taken.id)).epoch == taken.epoch


async def test_ends_without_their_runs_answer_none_and_still_refuse_each_lost_fence(
    runs: AgentRuns,
) -> None:
    """The worker's group asks for no ended run back: a held end answers None and its run is
    ended; a stale fence is still refused with its own error, and its run does not move."""
    stale, taken = await _stale(runs)
    held = await _leased(runs, 2)
    results = await runs.settle_group(
        [
            EndWrite(held[0].fence, TerminationReason.COMPLETED),
            EndWrite(stale, TerminationReason.COMPLETED),
            StepWrite(held[1].fence, "step", {"n": 1}),
        ],
        ended_runs=False,
    )
    assert results[0] is None
    assert isinstance(results[1], StaleEpoch)
    assert isinstance(results[2], RunEvent)
    ended = await runs.get(held[0].id)
    assert (ended.state, ended.end_reason) == (AgentRunState.ENDED, TerminationReason.COMPLETED)
    assert (await runs.get(taken.id)).state is AgentRunState.LEASED


async def test_a_group_mixes_steps_and_ends_and_answers_each_in_order(runs: AgentRuns) -> None:
    """Results come back in the order of the writes, whatever their kind; a bad event is
    refused before anything is written for it."""
    held = await _leased(runs, 3)
    results = await runs.settle_group(
        [
            EndWrite(held[0].fence, TerminationReason.COMPLETED),
            StepWrite(held[1].fence, "step", {"n": 1}),
            StepWrite(held[2].fence, "step", {"bad": object()}),  # type: ignore[dict-item]
        ]
    )
    assert isinstance(results[0], AgentRun)
    assert isinstance(results[1], RunEvent)
    assert isinstance(results[2], InvalidPayload)
    assert await runs.events(held[2].id) == []


async def test_a_group_naming_one_run_twice_is_refused_whole(runs: AgentRuns) -> None:
    """Two writes of one run in a group cannot be ordered: the group writes nothing."""
    [run] = await _leased(runs, 1)
    with pytest.raises(InvalidRequest):
        await runs.settle_group(
            [StepWrite(run.fence, "step", {}), EndWrite(run.fence, TerminationReason.COMPLETED)]
        )
    with pytest.raises(InvalidRequest):
        await runs.settle_group([StepWrite(run.fence, "a", {}), StepWrite(run.fence, "b", {})])
    assert await runs.events(run.id) == []
    assert (await runs.get(run.id)).state is AgentRunState.LEASED


async def test_the_settler_gives_each_concurrent_writer_its_own_answer(runs: AgentRuns) -> None:
    """Writers awaiting the settler together: each gets its event or its run, and the stale
    one its StaleEpoch; a second write of one run waits for the next group."""
    stale, taken = await _stale(runs)
    held = await _leased(runs, 4)
    settler = GroupSettler(runs, max_group=3)

    async def two_steps_then_end(run: AgentRun) -> AgentRun:
        await settler.step_boundary(run.fence, "step", {"n": 1})
        await settler.step_boundary(run.fence, "step", {"n": 2})
        await settler.end(run.fence, TerminationReason.COMPLETED)
        return await runs.get(run.id)

    *ended, refused = await asyncio.gather(
        *(two_steps_then_end(run) for run in held),
        settler.step_boundary(stale, "step", {"zombie": True}),
        return_exceptions=True,
    )
    assert isinstance(refused, StaleEpoch)
    for run, result in zip(held, ended, strict=True):
        assert isinstance(result, AgentRun)
        assert result.state is AgentRunState.ENDED
        assert [e.seq for e in await runs.events(run.id)] == [1, 2]
    assert await runs.events(taken.id) == []


async def test_workers_on_one_agentruns_share_one_settler(
    backend: Backend, runs: AgentRuns, kinds: RunKinds, rng: random.Random
) -> None:
    """Every worker of a process settles through one group, whatever its claimers: two workers
    driving runs at once both complete them, and an AgentRuns of its own groups apart."""
    shared = GroupSettler.shared(runs)
    assert GroupSettler.shared(runs) is shared
    assert GroupSettler.shared(AgentRuns(backend.stores, kinds, rng)) is not shared
    for index in range(6):
        await runs.enqueue("chat", workspace="acme", subject=f"s-{index}", payload={"steps": 1})
    workers = [Worker(runs, kinds, backend.stores.notifier, rng, holder=f"w-{n}") for n in range(2)]
    assert await asyncio.gather(*(worker.claim_and_drive(3) for worker in workers)) == [3, 3]
    for worker in workers:
        assert worker.stats.outcomes == {RunOutcome.COMPLETED: 3}


async def test_a_runs_writes_land_in_the_order_it_made_them_with_two_writers(
    runs: AgentRuns,
) -> None:
    """Two groups are written at once, but never two writes of one run: its second step waits
    for the group holding its first, so its events keep the order it made them in."""
    held = await _leased(runs, 3)
    settler = GroupSettler(runs, max_group=1, writers=2)
    first, second, third = held
    await asyncio.gather(
        *(settler.step_boundary(first.fence, "step", {"n": n}) for n in range(4)),
        settler.step_boundary(second.fence, "step", {"n": 0}),
        settler.step_boundary(third.fence, "step", {"n": 0}),
    )
    assert [e.data["n"] for e in await runs.events(first.id)] == [0, 1, 2, 3]
    for run in (second, third):
        assert [e.data["n"] for e in await runs.events(run.id)] == [0]
