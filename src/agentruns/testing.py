"""Test mode, public API: agentruns in memory with a manual clock, for a host's own tests.

::

    harness = agentruns.testing.harness(my_kind)
    run = await harness.runs.enqueue("review", workspace="acme", subject="review:1")
    report = await harness.drain()
    assert (await harness.runs.get(run.id)).end_reason is TerminationReason.COMPLETED

:meth:`AgentRunsHarness.drain` runs the worker and the reaper until nothing is due, moving the
manual clock to the next due run or lease expiry when it has to, so backoffs and lost leases play
out in a test without waiting.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.memory import MemoryFamily
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.ports import BudgetHold, Stores
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome
from agentruns.entrypoints.container import AgentRunsContainer, compose

__all__ = [
    "AgentRunsHarness",
    "BudgetHold",
    "DrainReport",
    "ManualClock",
    "MemoryFamily",
    "harness",
]


@dataclass
class DrainReport:
    """What a drain did: worker outcomes and the reaper's take-backs."""

    outcomes: Counter[RunOutcome] = field(default_factory=Counter)
    taken_back: int = 0
    overdue_ended: int = 0
    rounds: int = 0


class AgentRunsHarness:
    def __init__(
        self, container: AgentRunsContainer, clock: ManualClock, memory: MemoryFamily
    ) -> None:
        self.container = container
        self.clock = clock
        self.memory = memory
        self.stores: Stores = self.memory.stores
        self.kinds: RunKinds = container.kinds()
        self.runs: AgentRuns = container.runs()
        self.worker: Worker = container.worker(holder="test-worker")
        self.reaper: AgentRunReaper = container.reaper()

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

    async def drain(self, *, advance: bool = True, max_rounds: int = 10_000) -> DrainReport:
        """Run worker and reaper until nothing is due; with ``advance``, move the clock to the
        next due moment whenever nothing is due now, until no run is left unended."""
        report = DrainReport()
        before = Counter(self.worker.stats.outcomes)
        for _ in range(max_rounds):
            report.rounds += 1
            claimed = await self.worker.claim_and_drive(limit=32)
            reaped = await self.reaper.tick()
            report.taken_back += reaped.taken_back
            report.overdue_ended += reaped.overdue_ended
            if claimed or reaped.taken_back or reaped.overdue_ended:
                continue
            moment = self.next_moment() if advance else None
            if moment is None:
                break
            if moment > self.clock.now():
                self.clock.set(moment)
            elif not claimed:
                break  # due but not offered (inactive workspace, budget hold, blocked subject)
        report.outcomes = Counter(self.worker.stats.outcomes) - before
        return report


def harness(*kinds: RunKind, seed: int = 0, start: datetime | None = None) -> AgentRunsHarness:
    """A ready in-memory agentruns with a manual clock, seeded randomness and these kinds."""
    clock = ManualClock(start)
    memory = MemoryFamily(clock)
    container = compose(memory, kinds=RunKinds(kinds), clock=clock, rng=random.Random(seed))
    return AgentRunsHarness(container, clock, memory)
