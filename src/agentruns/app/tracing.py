"""The tracing port: spans for an enqueue and for each attempt of a run, whatever records them.

The default records nothing (:class:`NoTracing`); the OpenTelemetry adapter (the ``otel`` extra,
``agentruns.adapters.otel``) makes a span of an enqueue in the caller's trace and stores that
span's context with the run, so each attempt's spans (claim, each step, end), in whichever
process runs it, link back to the request that enqueued the work (ADRs/0014).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol
from uuid import UUID

from agentruns.domain.failure_records import FailureDetail
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import RunOutcome

TraceCarrier = dict[str, str]


class Span(Protocol):
    """One span in flight: ended (with the failure, if one), or dropped unrecorded."""

    def end(self, failure: FailureDetail | None = None) -> None: ...

    def drop(self) -> None: ...


class RunTrace(Protocol):
    """The spans of one attempt of a run, linked to the run's stored trace context."""

    def step(self, index: int) -> Span:
        """A span for step ``index``: the step's work and its boundary write."""
        ...

    def end(self) -> Span:
        """A span for settling the attempt (its end or its requeue)."""
        ...

    def close(self, outcome: RunOutcome, failure: FailureDetail | None = None) -> None:
        """The attempt came to ``outcome``: end its span."""
        ...


class Tracing(Protocol):
    def enqueue(
        self, kind: str, workspace: str, subject: str, run_id: UUID
    ) -> AbstractContextManager[TraceCarrier | None]:
        """A span around the enqueue of run ``run_id``, in the caller's current trace; yields
        the context to store with the run (``None``: nothing to store)."""
        ...

    def run(self, run: AgentRun, claim_seconds: float) -> RunTrace:
        """The spans of an attempt of ``run``, which a claim of ``claim_seconds`` leased."""
        ...


class _NoSpan(Span):
    def end(self, failure: FailureDetail | None = None) -> None:
        return None

    def drop(self) -> None:
        return None


_NO_SPAN = _NoSpan()


class _NoRunTrace(RunTrace):
    def step(self, index: int) -> Span:
        return _NO_SPAN

    def end(self) -> Span:
        return _NO_SPAN

    def close(self, outcome: RunOutcome, failure: FailureDetail | None = None) -> None:
        return None


_NO_RUN_TRACE = _NoRunTrace()


class NoTracing(Tracing):
    """Records nothing and stores no trace context: the default."""

    @contextmanager
    def _nothing(self) -> Iterator[TraceCarrier | None]:
        yield None

    def enqueue(
        self, kind: str, workspace: str, subject: str, run_id: UUID
    ) -> AbstractContextManager[TraceCarrier | None]:
        return self._nothing()

    def run(self, run: AgentRun, claim_seconds: float) -> RunTrace:
        return _NO_RUN_TRACE
