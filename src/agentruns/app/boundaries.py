"""A run's step boundaries in the worker: each step's work, timed, spanned and bounded by its
kind's step timeout, then its event written with the lease's renewal (ADRs/0007, 0011, 0022).

The work is a generator's next step or a recorded step's function. Past the kind's
``step_timeout`` the work is cancelled and the attempt fails with :class:`StepTimedOut`, a
retryable timeout: the bound is this process's own (monotonic) time, as the shutdown grace is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from agentruns.app.kinds import RunKind, StepEvent
from agentruns.app.metrics import Metrics
from agentruns.app.runs import AgentRuns
from agentruns.app.settler import GroupSettler
from agentruns.app.tracing import RunTrace
from agentruns.domain.errors import LeaseLost, StepTimedOut, StoreUnavailable
from agentruns.domain.failure_records import describe_failure
from agentruns.domain.run import AgentRun


class StepBoundaries:
    """A run's step boundaries, counted: each step's work, timed and spanned, then its event
    written with the renewal (with the group, or alone)."""

    __slots__ = ("_index", "_kind", "_metrics", "_run", "_runs", "_settler", "_timeout", "_trace")

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
        self._run = run
        self._kind = kind
        self._trace = trace
        self._settler = settler
        self._index = 0
        timeout = kind.policy.step_timeout
        self._timeout = None if timeout is None else timeout.total_seconds()

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

    async def step(
        self, work: Callable[[], Awaitable[StepEvent]], label: str | None = None
    ) -> StepEvent | None:
        """Run one step's ``work`` (cancelled past the kind's step timeout) and write its
        event; None when the steps were done (the work raised StopAsyncIteration)."""
        span = self._trace.step(self._index)
        began = time.perf_counter()
        try:
            if self._timeout is None:
                event = await work()
            else:
                event = await self._bounded(work, label)
        except StopAsyncIteration:
            span.drop()  # no step: the steps were done
            return None
        except (LeaseLost, StoreUnavailable):
            span.end()
            raise
        except Exception as error:
            span.end(
                describe_failure(error, self._kind.classify(error).failure_class, self._run.payload)
            )
            raise
        try:
            fence = self._run.fence
            if self._settler is not None:
                await self._settler.step_boundary(fence, event.type, event.data)
            else:
                await self._runs.step_boundary(fence, event.type, event.data)
        finally:
            span.end()
        self._metrics.renewed(self._run.kind)
        self._metrics.stepped(self._run.kind, time.perf_counter() - began)
        self._index += 1
        return event
