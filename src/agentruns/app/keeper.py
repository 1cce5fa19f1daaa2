"""A worker's lease keeper: the heartbeat through long steps, and the stop of a step whose run
was lost or cancelled (ADRs/0023).

One keeper per worker, and no task per run or per step: a timer, armed while the worker has runs
in flight, looks at each run's :class:`~agentruns.app.boundaries.StepBoundaries` every
``interval`` seconds (default: a tenth of the shortest lease in flight, at most 1 s; a run of a
shorter lease that starts while the keeper looks every second is seen at the next look, so with
leases of a few seconds or less, set ``interval``). A run whose current step's work has run a
third of its lease since the step began (or since its last heartbeat) is renewed, fenced, with
the group (:meth:`GroupSettler.renew_many`: one set-based statement for many runs). A run whose
steps are short never gets a heartbeat: its step boundaries renew it. The time is this
process's monotonic clock (``time.perf_counter``, which the boundaries already read), and, when
the worker was given one, an injected clock too (the test kit's manual clock: a step that moves
it past its lease is renewed as the clock says, see ``AgentRunsHarness.elapse``).

A heartbeat answered :class:`~agentruns.LeaseLost` (the lease ran out, the run was taken back or
cancelled), or a cancel heard from the notifier (:meth:`LeaseKeeper.cancelled`), stops the run's
step: its task is cancelled while it is inside the step's work (never during its boundary's
write, which the fence refuses on its own), and the boundaries turn that cancellation into
``LeaseLost``, so the run ends through the worker's lost-lease path (``LEASE_LOST``, or
``CANCELLED``). A run told between two steps stops at its next step. What the step does on
cancellation is bounded by ``grace`` seconds: past it the task is cancelled again, once, and one
line is logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from uuid import UUID

from agentruns.app.metrics import Metrics, NoMetrics
from agentruns.app.ports import Clock, Notifier, RenewWrite
from agentruns.app.runs import AgentRuns
from agentruns.app.settler import GroupSettler
from agentruns.domain.errors import AgentRunsError, LeaseLost, RunNotFound

if TYPE_CHECKING:
    from agentruns.app.boundaries import StepBoundaries

log = logging.getLogger("agentruns.worker")

# A step is renewed once it has run this share of its lease since it began or was last renewed.
RENEW_AFTER = 1 / 3
# The keeper looks this often, as a share of the shortest lease in flight, within these bounds.
_LOOKS_PER_LEASE = 10
_LONGEST_INTERVAL = 1.0
_SHORTEST_INTERVAL = 0.001


@dataclass(slots=True)
class Beat:
    """What the keeper knows of one step of one run: which step (its start), and when its
    lease was last renewed, on each clock."""

    step: float
    renewed: float
    renewed_on_clock: datetime | None
    lease: float


class LeaseKeeper:
    def __init__(
        self,
        runs: AgentRuns,
        notifier: Notifier,
        *,
        group_commit: bool,
        grace: float,
        interval: float | None = None,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if grace < 0:
            raise ValueError("a cancel grace is not negative")
        if interval is not None and interval <= 0:
            raise ValueError("a heartbeat interval is positive")
        self._runs = runs
        self._notifier = notifier
        self._group_commit = group_commit
        self._grace = grace
        self._interval = interval
        self._clock = clock
        self._metrics = metrics or NoMetrics()
        self._live: dict[UUID, StepBoundaries] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the timer is armed in
        self._unsubscribe: Callable[[], None] | None = None
        self._sending: asyncio.Task[None] | None = None
        self.renewals = 0  # heartbeats written (read by tests and benches)

    @property
    def grace(self) -> float:
        """Seconds a stopped step may run its cleanup before it is cancelled again."""
        return self._grace

    def watch(self, boundary: StepBoundaries) -> None:
        """Keep ``boundary``'s run until :meth:`forget`."""
        live = self._live
        if not live and (self._timer is None or self._loop is not asyncio.get_running_loop()):
            self._start(boundary.run.lease.total_seconds())
        live[boundary.run.id] = boundary

    def forget(self, boundary: StepBoundaries) -> None:
        """Stop keeping ``boundary``'s run. The timer stops at its next look if none is left
        (not here: a worker between two cohorts would stop and start it for every run)."""
        live = self._live
        if live.get(boundary.run.id) is boundary:
            del live[boundary.run.id]

    def _start(self, lease: float) -> None:
        self._stop()
        self._loop = asyncio.get_running_loop()
        self._unsubscribe = self._notifier.on_cancel(self.cancelled)
        self._arm(self._interval or self._every(lease))

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _arm(self, seconds: float) -> None:
        assert self._loop is not None
        self._timer = self._loop.call_later(seconds, self._tick)

    def cancelled(self, run_id: UUID) -> None:
        """The notifier's news that ``run_id`` was ended under its holder: stop its step."""
        boundary = self._live.get(run_id)
        if boundary is not None:
            self.stop(boundary, LeaseLost(f"run {run_id} was ended under its holder"))

    def stop(self, boundary: StepBoundaries, lost: LeaseLost) -> None:
        """Stop ``boundary``'s run: its step's work is cancelled now if it runs, else its next
        step does not start."""
        if boundary.lost is not None:
            return
        boundary.lost = lost
        if boundary.working is None:
            return  # between steps or writing a boundary: the next step or the fence stops it
        boundary.cancel()
        step = boundary.working
        asyncio.get_running_loop().call_later(self._grace, self._overdue, boundary, step)

    def _overdue(self, boundary: StepBoundaries, step: float) -> None:
        if boundary.working != step or self._live.get(boundary.run.id) is not boundary:
            return
        log.warning(
            "a cancelled step is still running past the cancel grace of %gs; cancelled again",
            self._grace,
            extra={"run_id": str(boundary.run.id), "kind": boundary.run.kind},
        )
        boundary.cancel()

    def _tick(self) -> None:
        self._timer = None
        if not self._live:
            self._stop()
            return
        due, shortest = self._due()
        if due and (self._sending is None or self._sending.done()):
            self._sending = asyncio.get_running_loop().create_task(self._send(due))
        self._arm(self._interval or self._every(shortest))

    @staticmethod
    def _every(lease: float) -> float:
        """How long between two looks when the shortest lease in flight is ``lease`` seconds."""
        return max(_SHORTEST_INTERVAL, min(_LONGEST_INTERVAL, lease / _LOOKS_PER_LEASE))

    def _due(self) -> tuple[list[tuple[StepBoundaries, Beat]], float]:
        """The runs whose step has run long since its last renewal, and the shortest lease."""
        now = time.perf_counter()
        on_clock = self._clock.now() if self._clock is not None else None
        due: list[tuple[StepBoundaries, Beat]] = []
        shortest = _LONGEST_INTERVAL * _LOOKS_PER_LEASE
        for boundary in self._live.values():
            step = boundary.working
            if step is None or boundary.lost is not None:
                continue
            beat = boundary.beat
            if beat is None or beat.step != step:
                # First seen in this step: its lease was renewed when the step began.
                beat = boundary.beat = Beat(
                    step, step, on_clock, boundary.run.lease.total_seconds()
                )
            shortest = min(shortest, beat.lease)
            after = beat.lease * RENEW_AFTER
            if now - beat.renewed >= after or (
                on_clock is not None
                and beat.renewed_on_clock is not None
                and (on_clock - beat.renewed_on_clock).total_seconds() >= after
            ):
                due.append((boundary, beat))
        return due, shortest

    async def beat(self) -> None:
        """Look at every run in flight now, and renew those due (for the test kit, whose clock
        moves inside a step: ``AgentRunsHarness.elapse``)."""
        if self._sending is not None and not self._sending.done():
            await asyncio.shield(self._sending)
        due, _ = self._due()
        if due:
            await self._send(due)

    async def _send(self, due: list[tuple[StepBoundaries, Beat]]) -> None:
        now = time.perf_counter()
        on_clock = self._clock.now() if self._clock is not None else None
        for _, beat in due:  # renewed as of now, so the next look does not send it again
            beat.renewed, beat.renewed_on_clock = now, on_clock
        fences = [boundary.run.fence for boundary, _ in due]
        try:
            if self._group_commit:
                results = await GroupSettler.shared(self._runs).renew_many(fences)
            else:
                answers = await self._runs.settle_group([RenewWrite(fence) for fence in fences])
                results = [a if isinstance(a, AgentRunsError) else None for a in answers]
        except Exception as error:  # the store is down: the next look tries again
            log.warning("heartbeat failed: %s", error)
            return
        failed = 0
        for (boundary, _), result in zip(due, results, strict=True):
            if result is None:
                self.renewals += 1
                self._metrics.renewed(boundary.run.kind)  # a renewal as a boundary's is
            elif isinstance(result, LeaseLost):
                # Lost for good (a fence never holds again), whichever step runs by now.
                self.stop(boundary, result)
            elif isinstance(result, RunNotFound):
                self.stop(boundary, LeaseLost(f"run {boundary.run.id} is gone"))
            else:
                failed += 1
        if failed:
            log.warning("%d heartbeat(s) failed; tried again at the next look", failed)
