"""The harness: agentruns with a manual clock and seeded randomness, in memory or on PostgreSQL,
with the ``runs``, ``worker`` and ``reaper`` a host uses in production.

::

    harness = agentruns.testing.harness(my_kind)                       # in memory
    harness = agentruns.testing.harness(my_kind, database_url=url)     # on PostgreSQL
    run = await harness.runs.enqueue("review", workspace="acme", subject="review:1")
    report = await harness.drain()
    assert (await harness.runs.get(run.id)).end_reason is TerminationReason.COMPLETED

On PostgreSQL every statement reads the manual clock (the database must be migrated; the pytest
plugin's ``agentruns_database_url`` gives a fresh one per test). :meth:`AgentRunsHarness.drain`
runs the worker and the reaper until nothing is left to do, moving the clock to the next moment
at which production would act, so backoffs, deadlines, budget holds and lost leases play out in a
test without waiting. With schedules (``harness(kind, schedules=[...])``) and
``drain(until=...)``, it also moves the clock across every schedule tick up to ``until``, so a
test can say "after three days, three digests ran".

A step that stands for a long call (a model call of minutes) says so with
``await harness.elapse(timedelta(minutes=5))``: the clock moves a fraction of the shortest lease
at a time and the worker's heartbeat beats between the moves, so the step keeps its lease as it
would in production (ADRs/0023); a step that moved the clock past its lease in one jump loses it.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self
from uuid import UUID

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.memory import MemoryFamily
from agentruns.app.approvals import AgentApprovals
from agentruns.app.family import AdapterFamily
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.ports import BudgetHold, Stores
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import MAX_PAGE, AgentRuns
from agentruns.app.scheduler import AgentScheduler
from agentruns.app.schedules import AgentSchedules
from agentruns.app.worker import Worker
from agentruns.domain.claim_order import next_moment
from agentruns.domain.payload import JsonObject
from agentruns.domain.run import AgentRun
from agentruns.domain.schedule import Schedule
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome
from agentruns.entrypoints.container import AgentRunsContainer, compose

if TYPE_CHECKING:
    from agentruns.adapters.tokens import SigningKey


@dataclass
class DrainReport:
    """What a drain did: worker outcomes, the reaper's take-backs and ends of overdue runs, and
    the runs schedule ticks enqueued."""

    outcomes: Counter[RunOutcome] = field(default_factory=Counter)
    scheduled: int = 0
    taken_back: int = 0
    overdue_ended: int = 0
    rounds: int = 0


class AgentRunsHarness:
    """agentruns over one adapter family on a manual clock: ``runs``, ``worker`` (holder
    ``test-worker``), ``reaper``, ``schedules`` and ``scheduler``, ``kinds`` (register more
    before draining), ``clock``."""

    def __init__(
        self, container: AgentRunsContainer, clock: ManualClock, family: AdapterFamily
    ) -> None:
        self.container = container
        self.clock = clock
        self.family = family
        self.stores: Stores = family.stores
        self.kinds: RunKinds = container.kinds()
        self.runs: AgentRuns = container.runs()
        # The worker's heartbeat reads the manual clock too: a step that lets time pass on it
        # (elapse) is renewed as production would renew a step that long.
        self.worker: Worker = container.worker(holder="test-worker", clock=clock)
        self.reaper: AgentRunReaper = container.reaper()
        self.schedules: AgentSchedules = container.schedules()
        self.scheduler: AgentScheduler = container.scheduler()
        self._synced = False

    @property
    def approvals(self) -> AgentApprovals:
        """Approval links over the harness's ``approval_keys`` (ADRs/0027): ``link``, and
        ``view`` and ``answer`` as the link's page would."""
        if not self.container.signs_approvals():
            raise TypeError("this harness has no approval keys: pass harness(approval_keys=...)")
        approvals: AgentApprovals = self.container.approvals()
        return approvals

    @property
    def memory(self) -> MemoryFamily:
        """The memory family, with its tables (in memory only)."""
        if not isinstance(self.family, MemoryFamily):
            raise TypeError("this harness runs on PostgreSQL: read runs with runs.list_runs()")
        return self.family

    def all_runs(self) -> list[AgentRun]:
        """Every run in the memory store, in queue order (in memory only; on either adapter,
        ``await harness.runs.list_runs(...)`` reads the same runs a page at a time)."""
        return sorted(self.memory.runs.rows.values(), key=lambda run: run.seq)

    async def held(self, workspace: str) -> BudgetHold | None:
        """The hold in force on ``workspace`` now (its budget's, ``by_budget``, or a host's
        own), or ``None``: a host test asserts a workspace whose budget was spent waits
        (ADRs/0033). ``elapse`` past the period's end and the hold is gone."""
        async with self.runs.stores.scope.transaction() as tx:
            for hold in await self.runs.stores.workspaces.holds(tx):
                if hold.workspace == workspace:
                    return hold
        return None

    async def unended(self) -> list[AgentRun]:
        """Every queued or leased run, newest first."""
        found: list[AgentRun] = []
        for state in (AgentRunState.QUEUED, AgentRunState.LEASED):
            cursor: str | None = None
            while True:
                page = await self.runs.list_runs(state=state, limit=MAX_PAGE, cursor=cursor)
                found.extend(page.runs)
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
        return sorted(found, key=lambda run: run.seq, reverse=True)

    async def conversation(self, workspace: str, subject: str) -> list[AgentRun]:
        """Every run of one subject (a conversation), oldest first, on either adapter: after a
        drain, what each message became under its enqueue's policy (ADRs/0028), each run ended
        ``completed``, ``cancelled`` by an interrupt, or still queued. Messages merged into a
        run (ADRs/0031) are that one run: :meth:`inputs` lists what it answered."""
        found: list[AgentRun] = []
        cursor: str | None = None
        while True:
            page = await self.runs.list_runs(
                workspace=workspace, subject=subject, limit=MAX_PAGE, cursor=cursor
            )
            found.extend(page.runs)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        return sorted(found, key=lambda run: run.seq)

    async def inputs(self, run_id: UUID) -> list[JsonObject]:
        """What the run answers (:meth:`agentruns.AgentRuns.inputs`): its payload, then each
        merged message's, in the order they joined."""
        return await self.runs.inputs(run_id)

    async def next_moment(self, *, waits: bool = True) -> datetime | None:
        """When production would next act if only time moved: a subject's head falls due, a
        budget hold ends, a lease expires, a queued run's deadline passes
        (:func:`agentruns.domain.claim_order.next_moment`); without ``waits``, a run waiting
        for a signal is not due at its timeout (a sleep's end still counts)."""
        async with self.stores.scope.transaction() as tx:
            status = await self.family.stats.status(tx)
        holds = {hold.workspace: hold.until for hold in status.holds}
        return next_moment(
            await self.unended(),
            now=self.clock.now(),
            holds=holds,
            inactive=frozenset(status.inactive),
            waits=waits,
        )

    async def drain(
        self, *, until: datetime | None = None, advance: bool = True, max_rounds: int = 10_000
    ) -> DrainReport:
        """Run the scheduler, worker and reaper until none has anything to do; with
        ``advance``, then move the clock to the next moment production would act
        (:meth:`next_moment`) and go on, until no such moment is left. Runs of an inactive
        workspace are left queued.

        A run waiting for a signal (``ctx.wait_for``) stops the drain there: the clock is not
        moved to its timeout, so a test signals it (``runs.signal``) and drains again, or moves
        the clock past the timeout itself. A durable sleep's end is played like any moment.

        With ``until``, the clock also crosses schedule ticks and waits' timeouts, and stops at
        ``until``: ticks, due runs and lease expiries after it wait for the next drain. Without
        it the clock never moves to a tick (a schedule has no end). The declared schedules are
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
            moment = await self._next_moment(ticked.next_due_at, until) if advance else None
            if moment is None:
                break
            self.clock.set(moment)
        report.outcomes = Counter(self.worker.stats.outcomes) - before
        return report

    async def _next_moment(
        self, next_tick: datetime | None, until: datetime | None
    ) -> datetime | None:
        # A run waiting for a signal stops a drain (the test signals it and drains again), unless
        # ``until`` says how far the clock may go: then its timeout is played like any moment.
        moment = await self.next_moment(waits=until is not None)
        if until is None:
            return moment
        now = self.clock.now()
        later = [
            candidate
            for candidate in (moment, next_tick, until)
            if candidate is not None and now < candidate <= until
        ]
        return min(later, default=None)

    async def elapse(self, duration: timedelta) -> None:
        """Let ``duration`` pass on the manual clock, from inside a step, as a long call would:
        the clock moves at most a sixth of the shortest registered lease at a time, and the
        worker's heartbeat looks between the moves (renewing the steps that have run a third of
        their lease). A step whose run was lost or cancelled meanwhile sees CancelledError here,
        as a production step would in its call."""
        if duration < timedelta(0):
            raise ValueError("time does not go back")
        leases = [self.kinds.get(name).policy.lease for name in self.kinds.names()]
        stride = min(leases, default=duration) / 6
        left = duration
        await self.worker.keeper.beat()
        while left > timedelta(0):
            move = min(stride, left) if stride > timedelta(0) else left
            self.clock.advance(move)
            left -= move
            await self.worker.keeper.beat()
            await asyncio.sleep(0)  # a stopped step's cancel lands here

    async def close(self) -> None:
        """Release what the family holds (a PostgreSQL pool); closing twice does nothing."""
        await self.family.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


class HarnessFactory(Protocol):
    """The ``agentruns_harness`` fixture: a harness on the test's adapter (memory or
    PostgreSQL), closed after the test."""

    def __call__(
        self,
        *kinds: RunKind,
        seed: int = 0,
        start: datetime | None = None,
        schedules: Sequence[Schedule] = (),
    ) -> AgentRunsHarness: ...


def harness(
    *kinds: RunKind,
    seed: int = 0,
    start: datetime | None = None,
    database_url: str | None = None,
    schedules: Sequence[Schedule] = (),
    approval_keys: Sequence[SigningKey] = (),
) -> AgentRunsHarness:
    """A ready agentruns with a manual clock (at ``start``), randomness seeded with ``seed``,
    these kinds and the schedules of their runs: in memory, or on the migrated PostgreSQL
    database at ``database_url``, whose statements then all read the manual clock. Close it (or
    ``async with``) on PostgreSQL. With ``approval_keys``, ``approvals`` makes and answers
    approval links (ADRs/0027), their times on the manual clock."""
    clock = ManualClock(start)
    family: AdapterFamily
    if database_url is None:
        family = MemoryFamily(clock)
    else:
        from agentruns.adapters.postgres import PostgresFamily

        family = PostgresFamily(database_url, clock)
    container = compose(
        family,
        kinds=RunKinds(kinds, schedules=schedules),
        clock=clock,
        rng=random.Random(seed),
        approval_keys=approval_keys,
    )
    return AgentRunsHarness(container, clock, family)
