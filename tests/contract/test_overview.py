"""The console's read model on every backend: the overview, the workspaces page, the listing's
new filters, event pages and continuations."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentruns.app.overview import MinuteCounts, Overview, WorkspaceLoads
from agentruns.app.ports import BudgetHold, NewFailure
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.stats import RunStats
from agentruns.domain.bands import Band
from agentruns.domain.errors import InvalidRequest
from agentruns.domain.failure_records import FailureDetail
from agentruns.domain.failures import FailureClass
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from tests.contract.conftest import START, Backend

WINDOW = timedelta(minutes=10)
SOON = timedelta(seconds=10)


@pytest.fixture
def stats(backend: Backend) -> RunStats:
    return backend.family.stats


async def _overview(backend: Backend, stats: RunStats) -> Overview:
    async with backend.stores.scope.transaction() as tx:
        return await stats.overview(tx, window=WINDOW, soon=SOON)


async def _loads(backend: Backend, stats: RunStats) -> WorkspaceLoads:
    async with backend.stores.scope.transaction() as tx:
        return await stats.workspace_loads(tx)


def _detail() -> FailureDetail:
    return FailureDetail("ProviderError", "overloaded", FailureClass.SERVER_ERROR, "Traceback")


async def test_an_empty_store_has_an_empty_overview(backend: Backend, stats: RunStats) -> None:
    found = await _overview(backend, stats)
    assert (found.live, found.ended, found.expiring, found.expiring_total) == ((), (), (), 0)
    assert found.now == backend.clock.now()
    assert len(found.minutes) == 10
    assert found.minutes[-1] == MinuteCounts(START.replace(second=0))
    assert all(wait.claims == 0 and wait.p50 is None for wait in found.waits)
    assert (await _loads(backend, stats)).loads == ()


async def test_the_overview_counts_each_state_and_each_minute(
    runs: AgentRuns, reaper: AgentRunReaper, backend: Backend, stats: RunStats
) -> None:
    clock = backend.clock
    for number in range(4):
        await runs.enqueue("chat", workspace="acme", subject=f"c:{number}", band=Band.INTERACTIVE)
    await runs.enqueue("sweep", workspace="globex", subject="s:1", band=Band.BACKGROUND)
    clock.advance(timedelta(seconds=5))
    # Minute 12:00: four claims; one completes, one fails and is requeued, one dead-letters.
    done, failed, dead, _lost = await runs.claim("w1", limit=4)
    clock.advance(timedelta(seconds=15))
    await runs.end(done.fence, TerminationReason.COMPLETED)
    await runs.requeue(
        failed.fence, charged=True, failure=NewFailure(failed.id, failed.epoch, _detail())
    )
    await runs.end(dead.fence, TerminationReason.NOT_RETRYABLE)
    # Minute 12:01: the fourth lease expires and the reaper takes it back.
    clock.advance(timedelta(seconds=60))
    await reaper.tick()

    found = await _overview(backend, stats)

    assert found.total(AgentRunState.QUEUED) == 3  # the requeued, the taken back, the sweep
    assert found.total(AgentRunState.QUEUED, band=Band.BACKGROUND, kind="sweep") == 1
    assert found.total(AgentRunState.LEASED) == 0
    assert found.total(AgentRunState.ENDED) == 2
    assert found.reasons() == {
        TerminationReason.COMPLETED: 1,
        TerminationReason.NOT_RETRYABLE: 1,
    }
    assert found.kinds() == ["chat", "sweep"]
    by_minute = {counts.minute: counts for counts in found.minutes}
    first = by_minute[START.replace(second=0)]
    second = by_minute[START.replace(minute=1, second=0)]
    # The completed and dead-lettered runs' claims, and the requeued one's (its failure is in
    # the window); the taken-back run's too.
    assert (first.claims, first.completions, first.dead_letters, first.requeues) == (4, 1, 1, 1)
    assert (second.lost_leases, second.requeues, second.claims) == (1, 1, 0)
    interactive = found.waits[Band.INTERACTIVE]
    # Waits of the runs claimed in the window that ended (a requeued run's due moved).
    assert interactive.claims == 2
    assert interactive.p50 == timedelta(seconds=5)
    assert interactive.p95 == timedelta(seconds=5)
    assert found.waits[Band.BACKGROUND].claims == 0


async def test_the_overview_lists_the_leases_that_expire_soon(
    runs: AgentRuns, backend: Backend, stats: RunStats
) -> None:
    for number in range(3):
        await runs.enqueue("chat", workspace="acme", subject=f"c:{number}")
    first, second, third = await runs.claim("w1", limit=3)
    backend.clock.advance(timedelta(seconds=15))
    await runs.renew(second.fence)  # 30 s from now: not soon
    backend.clock.advance(timedelta(seconds=10))  # the others have 5 s left

    found = await _overview(backend, stats)

    assert found.expiring_total == 2
    assert [lease.run_id for lease in found.expiring] == sorted(
        [first.id, third.id], key=lambda run_id: [first.id, third.id].index(run_id)
    )
    assert {lease.holder for lease in found.expiring} == {"w1"}
    assert found.total(AgentRunState.LEASED) == 3
    assert found.waits[Band.BATCH].claims == 3
    assert found.waits[Band.BATCH].p50 == timedelta(0)


async def test_workspace_loads_show_queued_leased_oldest_due_and_holds(
    runs: AgentRuns, backend: Backend, stats: RunStats
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="a:1", band=Band.INTERACTIVE)
    await runs.enqueue("chat", workspace="acme", subject="a:2", band=Band.BACKGROUND)
    await runs.enqueue("chat", workspace="acme", subject="a:3", due_at=START + timedelta(hours=1))
    await runs.enqueue("chat", workspace="globex", subject="g:1")
    backend.clock.advance(timedelta(seconds=30))
    [leased] = await runs.claim("w1", limit=1)
    assert leased.workspace == "acme"
    await runs.set_workspace_active("initech", False)
    await runs.hold_budget(BudgetHold("globex", START + timedelta(hours=2), "over budget"))

    loads = await _loads(backend, stats)

    by_name = {load.workspace: load for load in loads.loads}
    assert list(by_name) == ["acme", "globex", "initech"]
    assert by_name["acme"].queued == (0, 1, 1)
    assert by_name["acme"].leased == 1
    assert by_name["acme"].oldest_due_at == START  # the future one is not due
    assert by_name["globex"].hold == BudgetHold("globex", START + timedelta(hours=2), "over budget")
    assert not by_name["globex"].offered
    assert by_name["initech"].active is False
    assert by_name["initech"].queued_total == 0
    assert (loads.queued, loads.leased) == (3, 1)


async def test_runs_are_listed_by_band_and_enqueue_time_across_states(
    runs: AgentRuns, backend: Backend
) -> None:
    made = []
    for number in range(6):
        made.append(
            await runs.enqueue(
                "chat",
                workspace="acme",
                subject=f"c:{number}",
                band=Band.BACKGROUND if number % 2 else Band.BATCH,
            )
        )
        backend.clock.advance(timedelta(minutes=1))
    [leased] = await runs.claim("w1", limit=1)
    [ended] = await runs.claim("w1", limit=1)
    await runs.end(ended.fence, TerminationReason.NOT_RETRYABLE)

    everything = await runs.list_runs(limit=10)
    assert [run.id for run in everything.runs] == [run.id for run in reversed(made)]
    background = await runs.list_runs(band="background")
    assert [run.id for run in background.runs] == [made[5].id, made[3].id, made[1].id]
    window = await runs.list_runs(
        enqueued_after=START + timedelta(minutes=1), enqueued_before=START + timedelta(minutes=3)
    )
    assert [run.id for run in window.runs] == [made[2].id, made[1].id]
    dead = await runs.list_runs(reason="not_retryable", workspace="acme")
    assert [run.id for run in dead.runs] == [ended.id]
    assert (await runs.list_runs(reason="completed")).runs == []
    assert (await runs.list_runs(state="queued", reason="not_retryable")).runs == []
    # Paging through every state keeps the order.
    first = await runs.list_runs(limit=4)
    rest = await runs.list_runs(limit=4, cursor=first.next_cursor)
    assert [run.id for run in first.runs + rest.runs] == [run.id for run in reversed(made)]
    assert {run.state for run in first.runs + rest.runs} == set(AgentRunState)
    with pytest.raises(InvalidRequest):
        await runs.list_runs(band="loud")
    with pytest.raises(InvalidRequest):
        await runs.list_runs(enqueued_after=START.replace(tzinfo=None))
    assert leased.id in {run.id for run in first.runs + rest.runs}


async def test_events_come_a_page_at_a_time_and_a_continuation_is_found(
    runs: AgentRuns, backend: Backend
) -> None:
    run = await runs.enqueue("chat", workspace="acme", subject="c:1")
    [leased] = await runs.claim("w1", limit=1)
    for index in range(5):
        await runs.step_boundary(leased.fence, "step", {"index": index})
    await runs.end(leased.fence, TerminationReason.NOT_RETRYABLE)

    assert [event.seq for event in await runs.events(run.id, after_seq=1, limit=2)] == [2, 3]
    assert [event.seq for event in await runs.events(run.id, after_seq=4)] == [5]
    with pytest.raises(InvalidRequest):
        await runs.events(run.id, limit=0)
    assert await runs.continued_by(run.id) is None
    later = await runs.retry(run.id)
    continued = await runs.continued_by(run.id)
    assert continued is not None
    assert continued.id == later.id
