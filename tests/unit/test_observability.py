"""Structured logs and Prometheus metrics: what an operator reads about runs."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import pytest
from dependency_injector import providers
from prometheus_client import CollectorRegistry

import agentruns
from agentruns.adapters.prometheus import PrometheusMetrics, serve
from agentruns.app.kinds import RunKind, StepEvent
from agentruns.domain.backoff import Backoff
from agentruns.domain.bands import Band
from agentruns.domain.errors import StoreUnavailable
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import TerminationReason
from agentruns.entrypoints.demo.kinds import scripted_steps
from agentruns.entrypoints.logs import configure_logging
from agentruns.testing import harness

KIND = RunKind(
    RunKindPolicy(
        name="chat",
        lease=timedelta(seconds=30),
        backoff=Backoff(base=timedelta(seconds=1), jitter=0.0),
        retry_budget=1,
    ),
    scripted_steps,
)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """configure_logging changes the process-wide agentruns logger; put it back."""
    logger = logging.getLogger("agentruns")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_json_lines_carry_every_extra_field() -> None:
    stream = io.StringIO()
    configure_logging(format="json", stream=stream)
    logging.getLogger("agentruns.worker").info(
        "run %s", "completed", extra={"run_id": "r1", "kind": "chat", "epoch": 2}
    )
    line = json.loads(stream.getvalue())
    assert line["msg"] == "run completed"
    assert (line["run_id"], line["kind"], line["epoch"]) == ("r1", "chat", 2)


def test_key_value_lines_quote_values_with_spaces() -> None:
    stream = io.StringIO()
    configure_logging(format="kv", stream=stream)
    logging.getLogger("agentruns.reaper").warning("lease taken back", extra={"subject": "a b"})
    line = stream.getvalue().strip()
    assert 'msg="lease taken back"' in line
    assert 'subject="a b"' in line


async def test_every_worker_line_about_a_run_names_the_run() -> None:
    stream = io.StringIO()
    configure_logging(format="json", stream=stream)
    test = harness(KIND)
    await test.runs.enqueue("chat", workspace="acme", subject="c:1", payload={"steps": 1})
    await test.runs.enqueue("chat", workspace="acme", subject="c:2", payload={"fail": 401})
    await test.drain()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    about_runs = [line for line in lines if line["logger"] == "agentruns.worker"]
    assert about_runs
    for line in about_runs:
        assert {"run_id", "kind", "workspace", "subject", "epoch"} <= line.keys()


async def test_prometheus_counts_claims_renewals_ends_requeues_and_depth() -> None:
    metrics = PrometheusMetrics()
    test = harness(KIND)
    test.container.metrics.override(providers.Object(metrics))
    test.worker = test.container.worker(holder="test-worker")
    await test.runs.enqueue("chat", workspace="acme", subject="c:1", payload={"steps": 2})
    await test.runs.enqueue(
        "chat", workspace="acme", subject="c:2", payload={"fail": 503, "fail_attempts": 1}
    )
    await test.runs.enqueue("chat", workspace="acme", subject="c:3", payload={"fail": 401})
    await test.drain()
    metrics.queue_depth({Band.BATCH: 4})

    registry = metrics.registry
    assert _value(registry, "agentruns_claims_total") == 4
    assert _value(registry, "agentruns_claim_seconds_count", band="batch") >= 1
    assert _value(registry, "agentruns_renewals_total", kind="chat") >= 2
    assert _value(registry, "agentruns_requeues_total", kind="chat") == 1
    completed = str(TerminationReason.COMPLETED)
    assert _value(registry, "agentruns_ends_total", kind="chat", reason=completed) == 2
    not_retryable = str(TerminationReason.NOT_RETRYABLE)
    assert _value(registry, "agentruns_ends_total", kind="chat", reason=not_retryable) == 1
    assert _value(registry, "agentruns_queue_depth", band="batch") == 4
    assert _value(registry, "agentruns_queue_depth", band="interactive") == 0


async def _ask(run: agentruns.AgentRun, ctx: agentruns.StepContext) -> None:
    with contextlib.suppress(agentruns.WaitTimedOut):  # a timeout is an answer too
        await ctx.wait_for("approval", timeout=timedelta(hours=1))
    await ctx.sleep(timedelta(minutes=5))


async def test_prometheus_counts_waits_signals_timeouts_and_sleeps() -> None:
    """ADRs/0025: each wait of a holder is counted by what it came to; a wait is an attempt's
    outcome ``waiting``, not a failure."""
    metrics = PrometheusMetrics()
    ask = agentruns.RunKind(RunKindPolicy(name="ask"), agentruns.RecordedSteps(_ask))
    test = harness(ask)
    test.container.metrics.override(providers.Object(metrics))
    test.container.runs.reset()  # the harness built its runs and worker before the override
    test.runs = test.container.runs()
    test.worker = test.container.worker(holder="test-worker")
    answered = await test.runs.enqueue("ask", workspace="acme", subject="a")
    await test.runs.enqueue("ask", workspace="acme", subject="b")
    await test.drain()
    await test.runs.signal(answered.id, "approval", "yes", signal_id="mail-1")
    await test.runs.signal(answered.id, "approval", "yes", signal_id="mail-1")  # a retry
    await test.drain(until=test.clock.now() + timedelta(hours=2))

    registry = metrics.registry
    assert _value(registry, "agentruns_signals_total", kind="ask", new="yes") == 1
    assert _value(registry, "agentruns_signals_total", kind="ask", new="no") == 1

    def came_to(value: str) -> float | None:
        return _value(registry, "agentruns_waits_total", kind="ask", came_to=value)

    # Two waits and two sleeps given back; one signal, one timeout, two sleeps ended.
    assert (came_to("waiting"), came_to("signalled"), came_to("timed_out")) == (4, 1, 1)
    assert came_to("slept") == 2
    assert _value(registry, "agentruns_run_seconds_count", kind="ask", outcome="waiting") == 4
    assert _value(registry, "agentruns_ends_total", kind="ask", reason="completed") == 2


async def test_a_lost_lease_is_counted_apart_from_a_failure() -> None:
    metrics = PrometheusMetrics()
    test = harness(KIND)
    test.container.metrics.override(providers.Object(metrics))
    test.container.reaper.reset()  # the harness built one before the override
    reaper = test.container.reaper()
    worker = test.container.worker(holder="slow-worker")
    run = await test.runs.enqueue("chat", workspace="acme", subject="c:1", payload={"steps": 2})
    [claimed] = await test.runs.claim("slow-worker")
    test.clock.advance(timedelta(seconds=31))
    await reaper.tick()
    outcome = await worker.drive(claimed)

    registry = metrics.registry
    assert str(outcome) == "lease_lost"
    assert _value(registry, "agentruns_leases_lost_total", kind="chat") == 1
    assert _value(registry, "agentruns_take_backs_total", kind="chat", to="queued") == 1
    assert _value(registry, "agentruns_requeues_total", kind="chat") == 0
    for reason in TerminationReason:
        assert _value(registry, "agentruns_ends_total", kind="chat", reason=str(reason)) == 0
    assert (await test.runs.get(run.id)).epoch == 1


def test_the_memory_profile_imports_no_driver_and_no_metrics_client() -> None:
    """A host testing in memory (maybe installed without extras) imports neither."""
    probe = (
        "import sys, agentruns.testing, agentruns.entrypoints.container as c;"
        "c.AgentRunsContainer().runs();"
        "print(sorted(m for m in ('psycopg', 'sqlalchemy', 'prometheus_client', 'typer')"
        " if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert found == "[]"


async def test_histograms_time_the_queue_wait_the_steps_and_the_runs_by_bounded_labels() -> None:
    """Queue wait by kind and band (on the store's clock), step and run duration by kind, claim
    latency by band; an empty claim is timed under band "none"."""
    metrics = PrometheusMetrics()
    test = harness(KIND)
    test.container.metrics.override(providers.Object(metrics))
    test.worker = test.container.worker(holder="test-worker")
    await test.runs.enqueue(
        "chat", workspace="acme", subject="c:1", band="interactive", payload={"steps": 2}
    )
    test.clock.advance(timedelta(seconds=7))  # it waited 7 s before the claim
    await test.worker.claim_and_drive(4)
    await test.worker.claim_and_drive(4)  # nothing left: an empty claim

    registry = metrics.registry
    wait = {"kind": "chat", "band": "interactive"}
    assert _value(registry, "agentruns_queue_wait_seconds_count", **wait) == 1
    assert _value(registry, "agentruns_queue_wait_seconds_sum", **wait) == 7.0
    assert _value(registry, "agentruns_queue_wait_seconds_bucket", le="5.0", **wait) == 0
    assert _value(registry, "agentruns_queue_wait_seconds_bucket", le="15.0", **wait) == 1
    assert _value(registry, "agentruns_step_seconds_count", kind="chat") == 2
    finished = {"kind": "chat", "outcome": "completed"}
    assert _value(registry, "agentruns_run_seconds_count", **finished) == 1
    assert _value(registry, "agentruns_claim_seconds_count", band="interactive") == 1
    assert _value(registry, "agentruns_claim_seconds_count", band="none") == 1


async def test_a_run_logs_one_line_when_it_starts_and_one_with_its_duration_when_it_ends() -> None:
    stream = io.StringIO()
    configure_logging(format="json", stream=stream)
    test = harness(KIND)
    run = await test.runs.enqueue("chat", workspace="acme", subject="c:1", payload={"steps": 1})
    await test.drain()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    mine = [line for line in lines if line.get("run_id") == str(run.id)]
    assert [line["msg"] for line in mine] == ["run started", "run completed"]
    assert mine[0]["attempt"] == 0
    assert isinstance(mine[1]["duration_seconds"], float)


async def test_a_failed_step_logs_its_error_type_and_traceback() -> None:
    stream = io.StringIO()
    configure_logging(format="json", stream=stream)

    async def broken(run: AgentRun) -> AsyncIterator[StepEvent]:
        yield StepEvent("read")
        raise KeyError("missing-field")

    test = harness(RunKind(RunKindPolicy(name="broken", retry_budget=0), broken))
    await test.runs.enqueue("broken", workspace="acme", subject="b")
    await test.drain()
    [failed] = [
        json.loads(line) for line in stream.getvalue().splitlines() if "step failed" in line
    ]
    assert failed["msg"] == "step failed: KeyError: 'missing-field'"
    assert failed["error_type"] == "KeyError"
    assert failed["failure_class"] == "unknown"
    assert "in broken" in failed["traceback"]
    assert failed["traceback"].rstrip().endswith("KeyError: 'missing-field'")


async def test_a_stopped_worker_says_at_once_that_it_drains_and_how_many_runs_it_waits_for() -> (
    None
):
    """Before, a SIGTERM showed nothing until "worker stopped", up to the whole grace later."""
    stream = io.StringIO()
    configure_logging(format="json", stream=stream)
    release, both_started = asyncio.Event(), asyncio.Event()
    started: list[str] = []

    async def slow(run: AgentRun) -> AsyncIterator[StepEvent]:
        started.append(run.subject)
        if len(started) == 2:
            both_started.set()
        await release.wait()
        yield StepEvent("done")

    test = harness(RunKind(RunKindPolicy(name="slow"), slow))
    for subject in ("a", "b"):
        await test.runs.enqueue("slow", workspace="acme", subject=subject)
    stop = asyncio.Event()
    running = asyncio.create_task(test.worker.run(stop, grace=30.0))
    await asyncio.wait_for(both_started.wait(), timeout=10)
    stop.set()
    for _ in range(100):
        if "worker draining" in stream.getvalue():
            break
        await asyncio.sleep(0.01)
    [line] = [json.loads(line) for line in stream.getvalue().splitlines() if "draining" in line]
    assert not running.done()  # said while the runs still run
    assert line["in_flight"] == 2
    assert line["grace_seconds"] == 30.0
    assert "waiting up to 30s for 2 run(s) in flight" in line["msg"]
    release.set()
    await running


def test_the_process_and_python_collectors_are_served_and_no_created_series_unless_asked() -> None:
    metrics = PrometheusMetrics()
    metrics.claimed([], 0.01)
    metrics.requeued("chat")
    plain, asked = serve(metrics, 0), serve(metrics, 0, created=True)
    try:
        _, body = _get(plain.port, "/metrics")
        _, with_created = _get(asked.port, "/metrics")
    finally:
        plain.close()
        asked.close()
    for series in ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"):
        assert series in body, series
    assert "python_gc_objects_collected_total" in body
    assert "agentruns_requeues_total" in body
    assert "_created" not in body
    assert "agentruns_requeues_created" in with_created
    assert "agentruns_claim_seconds_created" in with_created


async def test_a_worker_exports_its_runs_in_flight_and_its_free_slots() -> None:
    metrics = PrometheusMetrics()
    metrics.worker_slots(8)
    release, both_started = asyncio.Event(), asyncio.Event()
    started: list[str] = []

    async def slow(run: AgentRun) -> AsyncIterator[StepEvent]:
        started.append(run.subject)
        if len(started) == 2:
            both_started.set()
        await release.wait()
        yield StepEvent("done")

    test = harness(RunKind(RunKindPolicy(name="slow"), slow))
    test.container.metrics.override(providers.Object(metrics))
    worker = test.container.worker(holder="w")
    for subject in ("a", "b"):
        await test.runs.enqueue("slow", workspace="acme", subject=subject)
    registry = metrics.registry
    assert _value(registry, "agentruns_worker_free_slots") == 8
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop, grace=30.0))
    await asyncio.wait_for(both_started.wait(), timeout=10)
    assert _value(registry, "agentruns_worker_runs_in_flight") == 2
    assert _value(registry, "agentruns_worker_free_slots") == 6
    release.set()
    stop.set()
    await running
    assert _value(registry, "agentruns_worker_runs_in_flight") == 0
    assert _value(registry, "agentruns_worker_free_slots") == 8


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_the_metrics_port_serves_metrics_health_and_nothing_else() -> None:
    healthy = True

    def health() -> None:
        if not healthy:
            raise StoreUnavailable("cannot reach PostgreSQL at db:5432/app: connection refused")

    metrics = PrometheusMetrics()
    metrics.queue_depth({Band.BATCH: 2})
    server = serve(metrics, 0, health=health)
    try:
        status, body = _get(server.port, "/metrics")
        assert status == 200
        assert 'agentruns_queue_depth{band="batch"} 2.0' in body
        assert _get(server.port, "/healthz") == (200, "ok\n")
        healthy = False
        status, body = _get(server.port, "/healthz")
        assert status == 503
        assert "connection refused" in body
        assert _get(server.port, "/")[0] == 404
        assert _get(server.port, "/metrics/extra")[0] == 404
    finally:
        server.close()


async def test_prometheus_counts_what_steps_spent_by_workspace_kind_provider_and_model() -> None:
    """ADRs/0033: tokens and cost counted once each boundary that reported them was written; a
    run whose steps report nothing adds nothing."""
    metrics = PrometheusMetrics()
    test = harness(KIND)
    test.container.metrics.override(providers.Object(metrics))
    test.container.runs.reset()
    test.runs = test.container.runs()
    test.worker = test.container.worker(holder="test-worker")
    await test.runs.enqueue(
        "chat", workspace="acme", subject="a", payload={"steps": 2, "step_ms": 0, "tokens": 40}
    )
    await test.runs.enqueue("chat", workspace="quiet", subject="b", payload={"step_ms": 0})
    await test.drain()
    registry = metrics.registry
    labels = {"workspace": "acme", "kind": "chat", "provider": "demo", "model": "demo-1"}
    assert _value(registry, "agentruns_input_tokens_total", **labels) == 80
    assert _value(registry, "agentruns_output_tokens_total", **labels) == 20
    assert _value(registry, "agentruns_cost_total", **labels) == pytest.approx(0.0001)
    quiet = {**labels, "workspace": "quiet"}
    assert _value(registry, "agentruns_input_tokens_total", **quiet) == 0
