"""A run's step boundaries in the worker: each step's work, timed, spanned and bounded by its
kind's step timeout, then its event written with the lease's renewal (ADRs/0007, 0011, 0022).

The work is a generator's next step or a recorded step's function. Past the kind's
``step_timeout`` the work is cancelled and the attempt fails with :class:`StepTimedOut`, a
retryable timeout: the bound is this process's own (monotonic) time, as the shutdown grace is.

While a step's work runs, the boundaries say so (:attr:`StepBoundaries.working`: when it began)
for the worker's lease keeper (:mod:`agentruns.app.keeper`, ADRs/0023), which renews the lease
of a step that runs long and stops one whose run was lost or cancelled: it cancels the run's
task inside the work, and :meth:`StepBoundaries.failed` turns that cancellation into
:class:`~agentruns.LeaseLost` (taking back only the cancels the keeper made, so a shutdown's
cancel still goes up as a cancel). A step that swallowed the cancel and returned writes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from agentruns.app.keeper import Beat
from agentruns.app.kinds import RunKind, RunResult, StepEvent
from agentruns.app.metrics import Metrics
from agentruns.app.runs import AgentRuns
from agentruns.app.settler import GroupSettler
from agentruns.app.tracing import RunTrace, Span
from agentruns.domain.errors import LeaseLost, StepTimedOut, StoreUnavailable
from agentruns.domain.failure_records import describe_failure
from agentruns.domain.run import AgentRun
from agentruns.domain.usage import Usage


class StepBoundaries:
    """A run's step boundaries, counted: each step's work, timed and spanned, then its event
    written with the renewal (with the group, or alone)."""

    __slots__ = (
        "_cancels",
        "_index",
        "_kind",
        "_metrics",
        "_runs",
        "_settler",
        "_task",
        "_timeout",
        "_trace",
        "beat",
        "lost",
        "run",
        "working",
    )

    def __init__(
        self,
        runs: AgentRuns,
        metrics: Metrics,
        run: AgentRun,
        kind: RunKind,
        trace: RunTrace,
        settler: GroupSettler | None,
    ) -> None:
        self._runs = runs
        self._metrics = metrics
        self.run = run
        self._kind = kind
        self._trace = trace
        self._settler = settler
        self._index = 0
        timeout = kind.policy.step_timeout
        self._timeout = None if timeout is None else timeout.total_seconds()
        # For the lease keeper: when the running step's work began (None outside the work), why
        # the run was lost if it was, what the keeper knows of the step, and the run's task.
        self.working: float | None = None
        self.lost: LeaseLost | None = None
        self.beat: Beat | None = None
        self._task = asyncio.current_task()
        self._cancels = 0

    def cancel(self) -> None:
        """Cancel the run's task (the keeper does, inside the step's work only)."""
        if self._task is not None and self._task.cancel():
            self._cancels += 1

    def _stopped(self) -> LeaseLost | None:
        """The loss to raise instead of the keeper's cancels (taken back from the task), or None
        when someone else cancelled the task too (a shutdown): then the cancel goes up."""
        lost = self.lost
        if lost is None:
            return None
        task = self._task
        if task is not None:
            while self._cancels:
                self._cancels -= 1
                task.uncancel()
            if task.cancelling():
                return None
        return lost

    async def _bounded(
        self, work: Callable[[], Awaitable[StepEvent]], label: str | None
    ) -> StepEvent:
        """``work`` cancelled once it has run the kind's step timeout: then StepTimedOut, even
        if the step swallowed the cancel and returned (the step's own TimeoutError, raised in
        time, goes up as it is)."""
        scope = asyncio.timeout(self._timeout)
        cause: TimeoutError | None = None
        try:
            async with scope:
                event = await work()
        except TimeoutError as error:
            if not scope.expired():
                raise
            cause = error
        if not scope.expired():
            return event
        named = f"step {label!r}" if label is not None else f"step {self._index + 1}"
        raise StepTimedOut(
            f"{named} ran past the step timeout of {self._kind.policy.step_timeout} "
            "and was cancelled"
        ) from cause

    # The parts of a step boundary, in order; :meth:`steps` and the worker's loop of a plain kind
    # (which runs the same parts inline, in the run's own coroutine: one coroutine fewer per run
    # on the worker's hot path) both call them, so each rule has one home.

    def begin(self) -> Span:
        """A step starts: its span, and the keeper told its work runs; the loss instead, if the
        run was lost between two steps (this step does not start)."""
        span = self._trace.step(self._index)
        if self.lost is not None:
            span.drop()
            raise self.lost
        self.working = time.perf_counter()
        return span

    def failed(self, span: Span, error: BaseException) -> BaseException:
        """The step's work raised ``error`` (not StopAsyncIteration): what to raise instead. The
        keeper's cancel becomes the loss (a shutdown's cancel goes up as it is); the run's
        failures end the span marked with it."""
        self.working = None
        if isinstance(error, (LeaseLost, StoreUnavailable)):
            span.end()
            return error
        if isinstance(error, asyncio.CancelledError):
            span.end()
            lost = self._stopped()
            return error if lost is None else lost
        span.end(
            describe_failure(error, self._kind.classify(error).failure_class, self.run.payload)
        )
        return error

    def worked(self, span: Span) -> float:
        """The step's work returned: when it began; the loss instead, if the step swallowed the
        keeper's cancel (then nothing is written)."""
        began = self.working
        assert began is not None
        self.working = None
        if self.lost is not None:
            span.end()
            self._stopped()
            raise self.lost
        return began

    def written(self, began: float, usage: Usage | None = None) -> None:
        """The step's event was written with the renewal (and its ``usage``, if it had any)."""
        self._metrics.renewed(self.run.kind)
        self._metrics.stepped(self.run.kind, time.perf_counter() - began)
        if usage is not None:
            self._metrics.spent(self.run.workspace, self.run.kind, usage)
        self._index += 1

    async def step(
        self, work: Callable[[], Awaitable[StepEvent]], label: str | None = None
    ) -> StepEvent:
        """Run one step's ``work`` (cancelled past the kind's step timeout) and write its
        event; the event (a recorded step's: its work always returns one)."""
        event = await self.steps(work, label, once=True)
        assert event is not None  # the work returned an event
        return event

    async def steps(
        self,
        work: Callable[[], Awaitable[StepEvent]],
        label: str | None = None,
        *,
        once: bool = False,
    ) -> StepEvent | None:
        """Steps while ``work`` gives events (a generator's ``__anext__``): each bounded by the
        kind's step timeout, timed, spanned and written; None once the work raises
        StopAsyncIteration (the steps were done), and a :class:`RunResult` given, unwritten,
        as it is (the steps' end too). With ``once``, one step, and its event."""
        while True:
            span = self.begin()
            try:
                if self._timeout is None:
                    event = await work()
                else:
                    event = await self._bounded(work, label)
            except StopAsyncIteration:
                self.working = None
                span.drop()  # no step: the steps were done
                return None
            except BaseException as error:
                replaced = self.failed(span, error)
                if replaced is error:
                    raise
                raise replaced from None
            if type(event) is RunResult:  # the run's result: not a step, the steps' end
                self.working = None
                span.drop()
                return event
            began = self.worked(span)
            try:
                if self._settler is not None:
                    await self._settler.step_boundary(
                        self.run.fence, event.type, event.data, event.usage
                    )
                else:
                    await self._runs.step_boundary(
                        self.run.fence, event.type, event.data, usage=event.usage
                    )
            finally:
                span.end()
            self.written(began, event.usage)
            if once:
                return event
