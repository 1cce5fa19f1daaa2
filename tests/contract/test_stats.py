"""The read model on every backend: what ``agentruns status`` and the demo's checks read."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentruns.app.ports import BudgetHold
from agentruns.app.runs import AgentRuns
from agentruns.app.stats import RunStats, RunStatus
from agentruns.domain.bands import Band
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from tests.contract.conftest import Backend
from tests.contract.kinds import LEASE


@pytest.fixture
def stats(backend: Backend) -> RunStats:
    return backend.family.stats


async def _status(backend: Backend, stats: RunStats) -> RunStatus:
    async with backend.stores.scope.transaction() as tx:
        return await stats.status(tx)


async def test_an_empty_store_has_an_empty_status(backend: Backend, stats: RunStats) -> None:
    status = await _status(backend, stats)
    assert status.counts == ()
    assert status.expired_leases == 0
    assert status.oldest_due_at is None
    assert status.now == backend.clock.now()


async def test_status_counts_runs_by_state_band_workspace_and_reason(
    runs: AgentRuns, backend: Backend, stats: RunStats
) -> None:
    for number in range(3):
        await runs.enqueue("chat", workspace="acme", subject=f"c:{number}", band=Band.INTERACTIVE)
    await runs.enqueue("sweep", workspace="globex", subject="s:1", band=Band.BACKGROUND)
    [leased] = await runs.claim("w", limit=1)
    assert leased.workspace == "acme"
    [other] = await runs.claim("w", limit=1)
    await runs.end(other.fence, TerminationReason.NOT_RETRYABLE)

    status = await _status(backend, stats)
    assert status.total() == 4
    assert status.total(AgentRunState.QUEUED) == 2
    assert status.total(AgentRunState.LEASED, workspace="acme") == 1
    assert status.total(AgentRunState.QUEUED, band=Band.BACKGROUND) == 1
    assert status.reasons() == {TerminationReason.NOT_RETRYABLE: 1}
    assert status.workspaces() == ["acme", "globex"]


async def test_status_sees_expired_leases_and_the_oldest_due_run(
    runs: AgentRuns, backend: Backend, stats: RunStats
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c:1")
    first_due = backend.clock.now()
    backend.clock.advance(timedelta(seconds=5))
    await runs.enqueue("chat", workspace="acme", subject="c:2")
    await runs.enqueue(
        "chat", workspace="acme", subject="c:3", due_at=backend.clock.now() + timedelta(hours=1)
    )
    backend.clock.advance(timedelta(seconds=5))

    status = await _status(backend, stats)
    assert status.oldest_due_at == first_due
    assert status.oldest_due_age == timedelta(seconds=10)

    await runs.claim("w", limit=2)
    backend.clock.advance(LEASE + timedelta(seconds=1))
    status = await _status(backend, stats)
    assert status.expired_leases == 2


async def test_status_lists_holds_in_force_and_inactive_workspaces(
    runs: AgentRuns, backend: Backend, stats: RunStats
) -> None:
    until = backend.clock.now() + timedelta(minutes=5)
    await runs.hold_budget(BudgetHold("overdrawn", until=until, reason="spent"))
    await runs.hold_budget(BudgetHold("lapsed", until=backend.clock.now() - timedelta(seconds=1)))
    await runs.set_workspace_active("dormant", False)

    status = await _status(backend, stats)
    assert status.holds == (BudgetHold("overdrawn", until=until, reason="spent"),)
    assert status.inactive == ("dormant",)
    assert status.unavailable == {"overdrawn", "dormant"}


async def test_runs_are_listed_by_state_and_holder_in_queue_order(
    runs: AgentRuns, backend: Backend, stats: RunStats
) -> None:
    queued = [
        await runs.enqueue("chat", workspace="acme", subject=f"c:{number}") for number in range(4)
    ]
    await runs.claim("worker-a", limit=2)
    await runs.claim("worker-b", limit=1)

    async with backend.stores.scope.transaction() as tx:
        mine = await stats.runs(tx, state=AgentRunState.LEASED, holder="worker-a")
        waiting = await stats.runs(tx, state=AgentRunState.QUEUED)
        everything = await stats.runs(tx, limit=3)
    assert [run.id for run in mine] == [run.id for run in queued[:2]]
    assert [run.id for run in waiting] == [queued[3].id]
    assert [run.id for run in everything] == [run.id for run in queued[:3]]


async def test_the_invariant_queries_find_nothing_wrong_in_a_healthy_store(
    runs: AgentRuns, backend: Backend, stats: RunStats
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="c:1")
    await runs.enqueue("chat", workspace="acme", subject="c:1")
    await runs.claim("w", limit=5)
    async with backend.stores.scope.transaction() as tx:
        assert await stats.doubly_leased_subjects(tx) == []
        assert await stats.unsettled(tx) == 0


async def test_status_names_the_kinds_of_expired_leases_and_which_are_orphaned(
    backend: Backend, stats: RunStats, runs: AgentRuns
) -> None:
    """A lease that stays expired long after its expiry has no reaper that knows its kind."""
    await runs.enqueue("chat", workspace="acme", subject="a")
    await runs.enqueue("sweep", workspace="acme", subject="b")
    await runs.claim("w", limit=2)
    backend.clock.advance(LEASE)
    status = await _status(backend, stats)
    assert [(e.kind, e.count) for e in status.expired_by_kind] == [("chat", 1), ("sweep", 1)]
    assert status.orphaned(timedelta(seconds=30)) == ()
    backend.clock.advance(timedelta(minutes=1))
    status = await _status(backend, stats)
    assert [e.kind for e in status.orphaned(timedelta(seconds=30))] == ["chat", "sweep"]


async def test_ended_before_counts_what_a_purge_would_delete(
    backend: Backend, stats: RunStats, runs: AgentRuns
) -> None:
    old = await runs.enqueue("chat", workspace="acme", subject="a")
    await runs.cancel(old.id)
    backend.clock.advance(timedelta(hours=2))
    recent = await runs.enqueue("chat", workspace="acme", subject="b")
    await runs.cancel(recent.id)
    await runs.enqueue("chat", workspace="acme", subject="c")
    async with backend.stores.scope.transaction() as tx:
        assert await stats.ended_before(tx, timedelta(hours=1)) == 1
        assert await stats.ended_before(tx, timedelta(0)) == 1  # the recent one ended now
    backend.clock.advance(timedelta(seconds=1))
    async with backend.stores.scope.transaction() as tx:
        assert await stats.ended_before(tx, timedelta(0)) == 2
    assert await runs.purge(timedelta(hours=1)) == 1
