"""Tracing with OpenTelemetry (the ``otel`` extra): the enqueue and each attempt of a run, as
the messaging semantic conventions describe a message sent and processed.

An enqueue is a ``send {kind}`` span (kind PRODUCER) in the caller's current context; its W3C
context (``traceparent``, ``tracestate``) is stored with the run. Whichever process later claims
the run makes each attempt a ``process {kind}`` span (kind CONSUMER) that *links* to that stored
context (the message's creation context) and starts a trace of its own: an attempt may run
hours after the request, and a run retried five times is five traces, each linked to the
request, not five children of a request long finished (ADRs/0014, addendum). Under the attempt's
span are a span for the claim (timed from the claim statement), one per step and one for the
end. While an attempt runs its span is the current one, so spans a host's steps make (an
instrumented model SDK's) nest under it. A failure marks the span with the error's type, its
redacted message and its bounded traceback (never the raw exception: its text may echo the
payload).

Both spans carry ``messaging.system`` (``agentruns``), ``messaging.operation.type`` (``send``,
``process``), ``messaging.operation.name`` (``enqueue``, ``process``),
``messaging.destination.name`` (the kind) and ``messaging.message.id`` (the run id), beside
agentruns' own ``agentruns.*`` attributes.

Spans go to the tracer provider given, else the global one that the host (or
``opentelemetry-instrument``) configured; with neither, the API's no-op tracer records nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from uuid import UUID

from opentelemetry import context as otel_context, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentruns.app.tracing import RunTrace, Span, TraceCarrier, Tracing
from agentruns.domain.failure_records import FailureDetail
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import RunOutcome

_PROPAGATOR = TraceContextTextMapPropagator()


SYSTEM = "agentruns"


def _messaging(operation: str, name: str, kind: str, run_id: UUID) -> dict[str, str | int]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": name,
        "messaging.destination.name": kind,
        "messaging.message.id": str(run_id),
    }


def _attributes(run: AgentRun) -> dict[str, str | int]:
    return {
        **_messaging("process", "process", run.kind, run.id),
        "agentruns.run_id": str(run.id),
        "agentruns.kind": run.kind,
        "agentruns.workspace": run.workspace,
        "agentruns.subject": run.subject,
        "agentruns.epoch": run.epoch,
        "agentruns.attempt": run.attempt,
    }


def _mark_failed(span: trace.Span, failure: FailureDetail) -> None:
    span.set_status(Status(StatusCode.ERROR, f"{failure.error_type}: {failure.message}"))
    span.add_event(
        "exception",
        {
            "exception.type": failure.error_type,
            "exception.message": failure.message,
            "exception.stacktrace": failure.traceback,
            "agentruns.failure_class": str(failure.failure_class),
        },
    )


class _TimedSpan(Span):
    """A span made when it ends, from the moment it was started: a step that turns out not to
    exist (the steps were done) is dropped without ever having been a span."""

    def __init__(
        self, tracer: trace.Tracer, name: str, parent: Context, attributes: dict[str, int]
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._parent = parent
        self._attributes = attributes
        self._start = time.time_ns()

    def end(self, failure: FailureDetail | None = None) -> None:
        span = self._tracer.start_span(
            self._name, context=self._parent, start_time=self._start, attributes=self._attributes
        )
        if failure is not None:
            _mark_failed(span, failure)
        span.end()

    def drop(self) -> None:
        return None


class _OtelRunTrace(RunTrace):
    def __init__(self, tracer: trace.Tracer, run: AgentRun, claim_seconds: float) -> None:
        self._tracer = tracer
        enqueued = trace.get_current_span(_PROPAGATOR.extract(run.trace_context or {}))
        created = enqueued.get_span_context()
        links = [trace.Link(created)] if created.is_valid else []
        now = time.time_ns()
        claimed_at = now - max(int(claim_seconds * 1e9), 0)
        # A root of its own (an empty context: not whatever the worker's task has current),
        # linked to the enqueue.
        root = Context()
        self._span = tracer.start_span(
            f"process {run.kind}",
            context=root,
            kind=SpanKind.CONSUMER,
            links=links,
            start_time=claimed_at,
            attributes=_attributes(run),
        )
        self._context = trace.set_span_in_context(self._span, root)
        tracer.start_span("agentruns.claim", context=self._context, start_time=claimed_at).end(
            end_time=now
        )
        # The attempt's span is current in its task while it runs: a host's spans nest under it.
        self._token = otel_context.attach(self._context)

    def step(self, index: int) -> Span:
        return _TimedSpan(self._tracer, "agentruns.step", self._context, {"agentruns.step": index})

    def end(self) -> Span:
        return _TimedSpan(self._tracer, "agentruns.end", self._context, {})

    def close(self, outcome: RunOutcome, failure: FailureDetail | None = None) -> None:
        self._span.set_attribute("agentruns.outcome", str(outcome))
        if failure is not None:
            _mark_failed(self._span, failure)
        self._span.end()
        # Closed from another context (nothing of ours is current there): nothing to undo.
        with contextlib.suppress(Exception):
            otel_context.detach(self._token)


class OtelTracing(Tracing):
    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("agentruns", tracer_provider=tracer_provider)

    def enqueue(
        self, kind: str, workspace: str, subject: str, run_id: UUID
    ) -> AbstractContextManager[TraceCarrier | None]:
        return self._enqueue(kind, workspace, subject, run_id)

    @contextmanager
    def _enqueue(
        self, kind: str, workspace: str, subject: str, run_id: UUID
    ) -> Iterator[TraceCarrier | None]:
        attributes = {
            **_messaging("send", "enqueue", kind, run_id),
            "agentruns.run_id": str(run_id),
            "agentruns.kind": kind,
            "agentruns.workspace": workspace,
            "agentruns.subject": subject,
        }
        with self._tracer.start_as_current_span(
            f"send {kind}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            carrier: TraceCarrier = {}
            _PROPAGATOR.inject(carrier)
            yield carrier or None

    def run(self, run: AgentRun, claim_seconds: float) -> RunTrace:
        return _OtelRunTrace(self._tracer, run, claim_seconds)
