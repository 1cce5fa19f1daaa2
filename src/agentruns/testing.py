"""Test mode, public API: agentruns in memory with a manual clock, for a host's own tests.

::

    harness = agentruns.testing.harness(my_kind)
    run = await harness.runs.enqueue("review", workspace="acme", subject="review:1")
    report = await harness.drain()
    assert (await harness.runs.get(run.id)).end_reason is TerminationReason.COMPLETED

:meth:`AgentRunsHarness.drain` runs the worker and the reaper until nothing is due, moving the
manual clock to the next due run or lease expiry when it has to, so backoffs and lost leases play
out in a test without waiting. With schedules (``harness(kind, schedules=[...])``) and
``drain(until=...)``, it also moves the clock across every schedule tick up to ``until``, so a
test can say "after three days, three digests ran".
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from dependency_injector import providers

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.memory import MemoryFamily
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.ports import Stores
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.scheduler import AgentScheduler
from agentruns.app.schedules import AgentSchedules
from agentruns.app.worker import Worker
from agentruns.domain.run import AgentRun
from agentruns.domain.schedule import Schedule
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome
from agentruns.entrypoints.container import AgentRunsContainer


@dataclass
class DrainReport:
    """What a drain did: worker outcomes, the reaper's take-backs and the runs schedule ticks
    enqueued."""

    outcomes: Counter[RunOutcome] = field(default_factory=Counter)
    scheduled: int = 0
    taken_back: int = 0
    overdue_ended: int = 0
    rounds: int = 0


class AgentRunsHarness:
    def __init__(self, container: AgentRunsContainer, clock: ManualClock) -> None:
        self.container = container
        self.clock = clock
        self.memory = MemoryFamily(clock)
        self.stores: Stores = self.memory.stores
        container.family.override(providers.Object(self.memory))
        self.kinds: RunKinds = container.kinds()
        self.runs: AgentRuns = container.runs()
        self.worker: Worker = container.worker(holder="test-worker")
        self.reaper: AgentRunReaper = container.reaper()
        self.schedules: AgentSchedules = container.schedules()
        self.scheduler: AgentScheduler = container.scheduler()
        self._synced = False

    def all_runs(self) -> list[AgentRun]:
        """Every run in the store, in queue order (memory only: a test's view of the table)."""
        return sorted(self.memory.runs.rows.values(), key=lambda run: run.seq)

    def next_moment(self) -> datetime | None:
        """When something next becomes due: a queued run's due time or a lease's expiry."""
        moments = [
            run.due_at if run.state is AgentRunState.QUEUED else run.leased_until
            for run in self.all_runs()
            if run.state is not AgentRunState.ENDED
        ]
        future = [moment for moment in moments if moment is not None]
        return min(future) if future else None

    async def drain(
        self, *, until: datetime | None = None, advance: bool = True, max_rounds: int = 10_000
    ) -> DrainReport:
        """Run the scheduler, worker and reaper until nothing is due; with ``advance``, move the
        clock to the next due moment whenever nothing is due now, until no run is left unended.

        With ``until``, the clock also crosses schedule ticks, and stops at ``until``: ticks,
        due runs and lease expiries after it wait for the next drain. The declared schedules are
        synced on the first drain."""
        if not self._synced:
            await self.schedules.sync()
            self._synced = True
        report = DrainReport()
        before = Counter(self.worker.stats.outcomes)
        for _ in range(max_rounds):
            report.rounds += 1
            ticked = await self.scheduler.tick()
            report.scheduled += len(ticked.enqueued)
            claimed = await self.worker.claim_and_drive(limit=32)
            reaped = await self.reaper.tick()
            report.taken_back += reaped.taken_back
            report.overdue_ended += reaped.overdue_ended
            if claimed or reaped.taken_back or reaped.overdue_ended:
                continue
            moment = self._next_moment(ticked.next_due_at, until) if advance else None
            if moment is None:
                break
            if moment > self.clock.now():
                self.clock.set(moment)
            elif not claimed:
                break  # due but not offered (inactive workspace, budget hold, blocked subject)
        report.outcomes = Counter(self.worker.stats.outcomes) - before
        return report

    def _next_moment(self, next_tick: datetime | None, until: datetime | None) -> datetime | None:
        moments = [self.next_moment()]
        if until is not None:
            moments.append(next_tick)
            moments = [moment for moment in moments if moment is None or moment <= until]
            if self.clock.now() < until:
                moments.append(until)  # nothing else before it: the clock ends there
        found = [moment for moment in moments if moment is not None]
        return min(found, default=None)


def harness(
    *kinds: RunKind,
    seed: int = 0,
    start: datetime | None = None,
    schedules: Sequence[Schedule] = (),
) -> AgentRunsHarness:
    """A ready in-memory agentruns with a manual clock, seeded randomness, these kinds and the
    schedules of their runs."""
    clock = ManualClock(start)
    container = AgentRunsContainer()
    container.clock.override(providers.Object(clock))
    container.rng.override(providers.Object(random.Random(seed)))
    container.kinds.override(providers.Object(RunKinds(kinds, schedules=schedules)))
    return AgentRunsHarness(container, clock)
