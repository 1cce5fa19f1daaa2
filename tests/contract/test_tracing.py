"""OpenTelemetry on every backend, by the messaging conventions: a request that enqueues agent
work links to each attempt of it.

The enqueue is a ``send {kind}`` span of the caller's trace and its context is stored with the
run; the worker that claims the run (here later, outside the request) makes each attempt a
``process {kind}`` span of a trace of its own, linked to the enqueue, with a claim span, a span
per step and an end span under it. Spans go to the SDK's in-memory exporter.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agentruns.adapters.otel import OtelTracing
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.run import AgentRun
from tests.contract.conftest import Backend
from tests.contract.kinds import policy


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    yield exported
    exported.clear()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    traced = TracerProvider()
    traced.add_span_processor(SimpleSpanProcessor(exporter))
    yield traced
    traced.shutdown()


async def two_steps(run: AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("read")
    yield StepEvent("wrote")


async def leaks(run: AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("read")
    raise ValueError(f"cannot parse {run.payload['document']}")


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


async def test_the_enqueue_is_a_send_span_and_the_attempt_a_process_span_linked_to_it(
    backend: Backend, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """The messaging conventions: ``send {kind}`` in the request's trace, carrying the run id;
    the attempt ``process {kind}``, a trace of its own that links to the send span, with its
    claim, steps and end under it."""
    tracing = OtelTracing(provider)
    kinds = RunKinds([RunKind(policy("traced"), two_steps)])
    runs = AgentRuns(backend.stores, kinds, random.Random(1), tracing=tracing)
    worker = Worker(
        runs, kinds, backend.stores.notifier, random.Random(2), holder="w", tracing=tracing
    )
    tracer = provider.get_tracer("host")
    with tracer.start_as_current_span("POST /documents") as request:
        run = await runs.enqueue("traced", workspace="acme", subject="doc:1")
    assert run.trace_context is not None
    assert "traceparent" in run.trace_context
    assert await worker.claim_and_drive(1) == 1

    spans = exporter.get_finished_spans()
    [send] = _by_name(spans, "send traced")
    [attempt] = _by_name(spans, "process traced")
    [claim] = _by_name(spans, "agentruns.claim")
    steps = _by_name(spans, "agentruns.step")
    [end] = _by_name(spans, "agentruns.end")
    assert send.kind is SpanKind.PRODUCER
    assert send.context.trace_id == request.get_span_context().trace_id
    assert send.parent is not None
    assert send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "agentruns",
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": "traced",
        "messaging.message.id": str(run.id),
        "agentruns.run_id": str(run.id),
        "agentruns.kind": "traced",
        "agentruns.workspace": "acme",
        "agentruns.subject": "doc:1",
    }

    assert attempt.kind is SpanKind.CONSUMER
    assert attempt.parent is None  # a trace of its own,
    assert attempt.context.trace_id != send.context.trace_id
    [link] = attempt.links  # linked to the enqueue
    assert (link.context.trace_id, link.context.span_id) == (
        send.context.trace_id,
        send.context.span_id,
    )
    attributes = dict(attempt.attributes or {})
    assert {key: attributes[key] for key in attributes if key.startswith("messaging.")} == {
        "messaging.system": "agentruns",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "traced",
        "messaging.message.id": str(run.id),
    }
    assert attributes["agentruns.run_id"] == str(run.id)
    assert attributes["agentruns.outcome"] == "completed"
    for child in (claim, *steps, end):
        assert child.parent is not None
        assert child.parent.span_id == attempt.context.span_id
        assert child.context.trace_id == attempt.context.trace_id
    assert [span.attributes["agentruns.step"] for span in steps] == [0, 1]  # type: ignore[index]


async def test_each_attempt_of_a_retried_run_is_a_trace_linked_to_the_enqueue(
    backend: Backend, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A retry is not one more child of a request long answered: one trace per attempt."""
    tracing = OtelTracing(provider)
    kinds = RunKinds([RunKind(policy("leaky"), leaks)])
    runs = AgentRuns(backend.stores, kinds, random.Random(1), tracing=tracing)
    worker = Worker(
        runs, kinds, backend.stores.notifier, random.Random(2), holder="w", tracing=tracing
    )
    with provider.get_tracer("host").start_as_current_span("POST /documents"):
        await runs.enqueue("leaky", workspace="acme", subject="d", payload={"document": "x"})
    await worker.claim_and_drive(1)
    backend.clock.advance(timedelta(hours=1))  # past the backoff
    await worker.claim_and_drive(1)

    spans = exporter.get_finished_spans()
    [send] = _by_name(spans, "send leaky")
    attempts = _by_name(spans, "process leaky")
    assert len(attempts) == 2
    assert len({attempt.context.trace_id for attempt in attempts}) == 2
    for attempt in attempts:
        assert attempt.parent is None
        assert [link.context.span_id for link in attempt.links] == [send.context.span_id]


async def test_a_failed_step_marks_its_spans_without_echoing_the_payload(
    backend: Backend, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracing = OtelTracing(provider)
    kinds = RunKinds([RunKind(policy("leaky"), leaks)])
    runs = AgentRuns(backend.stores, kinds, random.Random(1), tracing=tracing)
    worker = Worker(
        runs, kinds, backend.stores.notifier, random.Random(2), holder="w", tracing=tracing
    )
    await runs.enqueue("leaky", workspace="acme", subject="d", payload={"document": "secret plan"})
    await worker.claim_and_drive(1)

    spans = exporter.get_finished_spans()
    [attempt] = _by_name(spans, "process leaky")
    failed_step = _by_name(spans, "agentruns.step")[-1]
    for span in (attempt, failed_step):
        assert span.status.status_code is StatusCode.ERROR
        [event] = [event for event in span.events if event.name == "exception"]
        assert event.attributes is not None
        assert event.attributes["exception.type"] == "ValueError"
        text = f"{span.status.description} {event.attributes['exception.message']}"
        text += str(event.attributes["exception.stacktrace"])
        assert "secret plan" not in text
    assert attempt.attributes is not None
    assert attempt.attributes["agentruns.outcome"] == "requeued"
