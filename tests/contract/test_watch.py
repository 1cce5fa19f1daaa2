"""Watching a run on every backend (ADRs/0030): its events in order as they commit, a resume
after an event with nothing lost or repeated, the end last with the result, ``wait``, an unknown
run, and a zombie holder's refused write never seen."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from uuid import uuid4

import pytest

from agentruns.app.runs import AgentRuns
from agentruns.app.watch import RunUpdate
from agentruns.domain.errors import InvalidRequest, LeaseLost, RunNotFound, RunWaitTimedOut
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from tests.contract.conftest import Backend

# A safety net: every wait below ends far sooner when the watch works.
_SOON = 20.0


async def _next(updates: AsyncIterator[RunUpdate]) -> RunUpdate:
    async with asyncio.timeout(_SOON):
        return await anext(updates)


async def _leased(runs: AgentRuns) -> AgentRun:
    await runs.enqueue("chat", workspace="acme", subject="conversation:1")
    (run,) = await runs.claim("worker-1")
    return run


async def test_a_watch_sees_the_state_each_event_in_order_and_the_end_with_its_result(
    runs: AgentRuns,
) -> None:
    enqueued = await runs.enqueue("chat", workspace="acme", subject="conversation:1")
    updates = runs.watch(enqueued.id)
    first = await _next(updates)
    assert first.event is None
    assert first.run.state is AgentRunState.QUEUED
    (run,) = await runs.claim("worker-1")
    claimed = await _next(updates)
    assert claimed.event is None
    assert (claimed.run.state, claimed.run.epoch) == (AgentRunState.LEASED, 1)
    for n in range(1, 4):
        await runs.step_boundary(run.fence, "step", {"n": n})
        update = await _next(updates)
        assert update.event is not None
        assert (update.seq, update.event.type, update.event.data) == (n, "step", {"n": n})
        assert not update.ended
    await runs.end(run.fence, TerminationReason.COMPLETED, result={"answer": 42})
    last = await _next(updates)
    assert last.ended
    assert last.event is None
    assert last.seq is None
    assert last.run.end_reason is TerminationReason.COMPLETED
    assert last.run.result == {"answer": 42}
    with pytest.raises(StopAsyncIteration):
        await _next(updates)


async def test_a_watch_that_resumes_after_an_event_loses_and_repeats_nothing(
    runs: AgentRuns,
) -> None:
    run = await _leased(runs)
    for n in range(1, 6):
        await runs.step_boundary(run.fence, "step", {"n": n})
    updates = runs.watch(run.id, after=2)
    seen: list[int] = []
    state = await _next(updates)
    assert state.event is None
    assert state.run.state is AgentRunState.LEASED
    while len(seen) < 3:
        update = await _next(updates)
        assert update.seq is not None
        seen.append(update.seq)
    assert seen == [3, 4, 5]
    await runs.step_boundary(run.fence, "step", {"n": 6})
    assert (await _next(updates)).seq == 6
    await runs.end(run.fence, TerminationReason.COMPLETED)
    assert (await _next(updates)).ended
    await updates.aclose()


async def test_a_watch_of_an_ended_run_hands_out_its_events_then_the_end(
    runs: AgentRuns,
) -> None:
    run = await _leased(runs)
    await runs.step_boundary(run.fence, "step", {"n": 1})
    await runs.end(run.fence, TerminationReason.FAILED)
    got = [update async for update in runs.watch(run.id)]
    assert [update.seq for update in got] == [1, None]
    assert got[-1].ended
    assert got[-1].run.end_reason is TerminationReason.FAILED


async def test_a_requeue_and_a_new_claim_are_state_items_between_the_epochs_events(
    runs: AgentRuns, backend: Backend
) -> None:
    run = await _leased(runs)
    updates = runs.watch(run.id)
    assert (await _next(updates)).run.epoch == 1
    await runs.step_boundary(run.fence, "step", {"n": 1})
    assert (await _next(updates)).seq == 1
    await runs.requeue(run.fence, charged=False, delay=timedelta(0))
    requeued = await _next(updates)
    assert requeued.event is None
    assert requeued.run.state is AgentRunState.QUEUED
    (again,) = await runs.claim("worker-2")
    reclaimed = await _next(updates)
    assert (reclaimed.run.state, reclaimed.run.epoch) == (AgentRunState.LEASED, 2)
    await runs.step_boundary(again.fence, "step", {"n": 2})
    event = await _next(updates)
    assert event.event is not None
    assert (event.seq, event.event.epoch) == (2, 2)
    await updates.aclose()


async def test_a_zombie_holders_refused_write_is_never_seen(
    runs: AgentRuns, backend: Backend
) -> None:
    run = await _leased(runs)
    stale = run.fence
    updates = runs.watch(run.id)
    await _next(updates)
    await runs.step_boundary(stale, "step", {"n": 1})
    assert (await _next(updates)).seq == 1
    backend.clock.advance(run.lease + timedelta(seconds=1))
    with pytest.raises(LeaseLost):
        await runs.step_boundary(stale, "step", {"zombie": True})
    await runs.cancel(run.id)
    rest = [update async for update in updates]
    assert [update.seq for update in rest] == [None]
    assert rest[-1].ended
    assert rest[-1].run.end_reason is TerminationReason.CANCELLED
    events = await runs.events(run.id)
    assert [event.data for event in events] == [{"n": 1}]


async def test_wait_returns_the_ended_run_with_its_result(runs: AgentRuns) -> None:
    run = await _leased(runs)
    waiter = asyncio.create_task(runs.wait(run.id, timeout=_SOON))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await runs.end(run.fence, TerminationReason.COMPLETED, result=["done"])
    ended = await waiter
    assert ended.state is AgentRunState.ENDED
    assert ended.result == ["done"]
    assert (await runs.wait(run.id)).result == ["done"]  # ended already: at once


async def test_wait_past_its_timeout_says_so_and_the_run_goes_on(runs: AgentRuns) -> None:
    run = await _leased(runs)
    with pytest.raises(RunWaitTimedOut) as raised:
        await runs.wait(run.id, timeout=timedelta(milliseconds=100))
    assert isinstance(raised.value, TimeoutError)
    assert raised.value.run.id == run.id
    assert raised.value.run.state is AgentRunState.LEASED
    assert str(run.id) in str(raised.value)
    assert (await runs.get(run.id)).state is AgentRunState.LEASED


async def test_an_unknown_run_and_bad_input_are_refused(runs: AgentRuns) -> None:
    with pytest.raises(RunNotFound):
        await _next(runs.watch(uuid4()))
    with pytest.raises(RunNotFound):
        await runs.wait(uuid4(), timeout=1.0)
    run = await _leased(runs)
    await runs.step_boundary(run.fence, "step", {"n": 1})
    for after in (-1, True, "1", 1.5):
        with pytest.raises(InvalidRequest):
            await _next(runs.watch(run.id, after=after))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="no event 2"):
        await _next(runs.watch(run.id, after=2))
    for timeout in (0, -1.0, "1", timedelta(days=2)):
        with pytest.raises(InvalidRequest):
            await runs.wait(run.id, timeout=timeout)  # type: ignore[arg-type]


async def test_many_watchers_of_one_run_each_see_every_event_once(runs: AgentRuns) -> None:
    run = await _leased(runs)

    async def follow() -> list[int | None]:
        return [update.seq async for update in runs.watch(run.id)]

    watchers = [asyncio.create_task(follow()) for _ in range(20)]
    await asyncio.sleep(0.1)
    for n in range(1, 4):
        await runs.step_boundary(run.fence, "step", {"n": n})
    await runs.end(run.fence, TerminationReason.COMPLETED)
    async with asyncio.timeout(_SOON):
        seen = await asyncio.gather(*watchers)
    for one in seen:
        assert [seq for seq in one if seq is not None] == [1, 2, 3]
        assert one[-1] is None


async def test_a_watch_pages_through_a_long_history_with_one_state_item(
    runs: AgentRuns,
) -> None:
    run = await _leased(runs)
    total = 1_010  # more than two of the watch's pages
    async with runs.transaction() as tx:
        for n in range(1, total + 1):
            await runs.step_boundary(run.fence, "step", {"n": n}, tx=tx)
    updates = runs.watch(run.id)
    got = []
    async with asyncio.timeout(_SOON):
        while len(got) < total + 1:
            got.append(await anext(updates))
    assert got[0].event is None
    assert got[0].run.state is AgentRunState.LEASED
    assert [update.seq for update in got[1:]] == list(range(1, total + 1))
    await runs.end(run.fence, TerminationReason.COMPLETED)
    assert (await _next(updates)).ended
