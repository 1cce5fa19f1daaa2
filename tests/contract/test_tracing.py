"""OpenTelemetry on every backend: a request that enqueues agent work sees the work in its trace.

The enqueue is a span of the caller's trace and its context is stored with the run; the worker
that claims the run (here later, outside the request) makes the attempt's span a child of it,
with a claim span, a span per step and an end span under it. Spans go to the SDK's in-memory
exporter.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

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


async def test_the_enqueue_and_the_runs_claim_steps_and_end_are_one_trace(
    backend: Backend, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
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
    trace_id = request.get_span_context().trace_id
    assert {span.context.trace_id for span in spans} == {trace_id}
    [enqueue] = _by_name(spans, "agentruns.enqueue")
    [attempt] = _by_name(spans, "agentruns.run")
    [claim] = _by_name(spans, "agentruns.claim")
    steps = _by_name(spans, "agentruns.step")
    [end] = _by_name(spans, "agentruns.end")
    assert enqueue.parent is not None
    assert enqueue.parent.span_id == request.get_span_context().span_id
    assert attempt.parent is not None
    assert attempt.parent.span_id == enqueue.context.span_id
    for child in (claim, *steps, end):
        assert child.parent is not None
        assert child.parent.span_id == attempt.context.span_id
    assert [span.attributes["agentruns.step"] for span in steps] == [0, 1]  # type: ignore[index]
    assert attempt.attributes is not None
    assert attempt.attributes["agentruns.run_id"] == str(run.id)
    assert attempt.attributes["agentruns.outcome"] == "completed"


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
    [attempt] = _by_name(spans, "agentruns.run")
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
