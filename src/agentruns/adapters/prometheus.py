"""Metrics for Prometheus, and the HTTP endpoint a process serves them on with its health.

Counters, histograms (claim latency by band, queue wait by kind and band, step and run duration
by kind), a queue depth gauge, and the worker's runs in flight and free slots. Labels are bounded:
kinds the process registered, three bands, the run outcomes. Each instance registers its series
in its own registry unless handed one, so tests and several containers in one process do not
collide; its own registry also carries prometheus_client's process and Python collectors
(``process_*``: CPU, memory, open files; ``python_info``, ``python_gc_*``), which a registry
handed in is assumed to have already (the default one does).

:func:`serve` answers ``/metrics`` with the registry, ``/healthz`` with the process's health
check (200 when it passes, 503 with the reason when it does not) and 404 anywhere else. It leaves
out the ``*_created`` series of counters and histograms (a timestamp per label set, which doubles
the series a scrape stores for no question an operator asks) unless asked for: the filter is the
endpoint's, so a host's own use of prometheus_client is left as it is
(``disable_created_metrics()`` would switch them off for the whole process).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from agentruns.app.metrics import Metrics
from agentruns.domain.bands import Band
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import RunOutcome, TerminationReason
from agentruns.domain.usage import Usage

_CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)
_STEP_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0)
_RUN_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)

# No run leased: the claim's latency still counts, under this band label.
NO_BAND = "none"

# A step's usage named no provider or model: counted under this label.
NO_NAME = "none"


def band_label(band: Band) -> str:
    return band.name.lower()


class PrometheusMetrics(Metrics):
    """The metrics port recorded in a prometheus_client registry (its own unless handed one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is None:
            registry = CollectorRegistry()
            # What every Prometheus client exports by default, in this registry of its own.
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        self.registry = registry
        self._slots: int | None = None
        self._flying = 0
        self._in_flight = Gauge(
            "agentruns_worker_runs_in_flight",
            "Runs this process's worker is driving now: claimed, not yet come to an outcome",
            registry=self.registry,
        )
        self._claims = Counter("agentruns_claims", "Runs leased by claims", registry=self.registry)
        self._claim_seconds = Histogram(
            "agentruns_claim_seconds",
            "Time one claim statement took, by each band it leased runs of ('none': it leased "
            "nothing)",
            ["band"],
            buckets=_CLAIM_BUCKETS,
            registry=self.registry,
        )
        self._queue_wait = Histogram(
            "agentruns_queue_wait_seconds",
            "From a run being due to its claim, on the database clock",
            ["kind", "band"],
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self._step_seconds = Histogram(
            "agentruns_step_seconds",
            "One step of a run: its work and its boundary write",
            ["kind"],
            buckets=_STEP_BUCKETS,
            registry=self.registry,
        )
        self._run_seconds = Histogram(
            "agentruns_run_seconds",
            "One attempt of a run, from its claim to its outcome",
            ["kind", "outcome"],
            buckets=_RUN_BUCKETS,
            registry=self.registry,
        )
        self._renewals = Counter(
            "agentruns_renewals", "Lease renewals", ["kind"], registry=self.registry
        )
        self._leases_lost = Counter(
            "agentruns_leases_lost",
            "Holders that found their lease gone (not failures)",
            ["kind"],
            registry=self.registry,
        )
        self._take_backs = Counter(
            "agentruns_take_backs",
            "Expired leases the reaper took back",
            ["kind", "to"],
            registry=self.registry,
        )
        self._requeues = Counter(
            "agentruns_requeues",
            "Charged requeues after a failure",
            ["kind"],
            registry=self.registry,
        )
        self._ends = Counter(
            "agentruns_ends", "Runs ended, by reason", ["kind", "reason"], registry=self.registry
        )
        self._waits = Counter(
            "agentruns_waits",
            "Waits and sleeps of recorded kinds, by what each came to: waiting (the lease given "
            "back), signalled, timed_out, slept",
            ["kind", "came_to"],
            registry=self.registry,
        )
        self._signals = Counter(
            "agentruns_signals",
            "Signals delivered to runs, by kind and whether the delivery kept a new signal (yes) "
            "or repeated a signal id the run had seen (no: nothing written)",
            ["kind", "new"],
            registry=self.registry,
        )
        # What steps spent (ADRs/0033), by workspace, kind, provider and model ("none" where a
        # step named none): the one place a workspace is a label, bounded by the workspaces that
        # report usage to this process.
        spent = ["workspace", "kind", "provider", "model"]
        self._input_tokens = Counter(
            "agentruns_input_tokens",
            "Input tokens the steps reported with their step boundaries",
            spent,
            registry=self.registry,
        )
        self._output_tokens = Counter(
            "agentruns_output_tokens",
            "Output tokens the steps reported with their step boundaries",
            spent,
            registry=self.registry,
        )
        self._cost = Counter(
            "agentruns_cost",
            "Cost the steps reported with their step boundaries",
            spent,
            registry=self.registry,
        )
        self._depth = Gauge(
            "agentruns_queue_depth", "Queued runs by band", ["band"], registry=self.registry
        )

    def worker_slots(self, concurrency: int) -> None:
        """Export ``agentruns_worker_free_slots``: the process runs a worker of ``concurrency``
        slots (a reaper or a gateway has none, and exports no such gauge)."""
        if self._slots is None:
            Gauge(
                "agentruns_worker_free_slots",
                "Runs this process's worker could take on now: its concurrency less its runs in "
                "flight",
                registry=self.registry,
            ).set_function(self._free_slots)
        self._slots = concurrency

    def _free_slots(self) -> float:
        return float(max((self._slots or 0) - self._flying, 0))

    def claimed(self, runs: Sequence[AgentRun], seconds: float) -> None:
        self._claims.inc(len(runs))
        # Each run claimed is driven once, to one finished(). Only the worker claims through
        # this port (the gateway's sandboxes hold runs, not slots).
        self._flying += len(runs)
        self._in_flight.set(self._flying)
        bands = {run.band for run in runs}
        for band in sorted(bands):
            self._claim_seconds.labels(band_label(band)).observe(seconds)
        if not bands:
            self._claim_seconds.labels(NO_BAND).observe(seconds)
        for run in runs:
            if run.leased_until is None:
                continue
            leased_at = run.leased_until - run.lease
            waited = max((leased_at - run.due_at).total_seconds(), 0.0)
            self._queue_wait.labels(run.kind, band_label(run.band)).observe(waited)

    def renewed(self, kind: str) -> None:
        self._renewals.labels(kind).inc()

    def stepped(self, kind: str, seconds: float) -> None:
        self._step_seconds.labels(kind).observe(seconds)

    def finished(self, kind: str, outcome: RunOutcome, seconds: float) -> None:
        self._run_seconds.labels(kind, str(outcome)).observe(seconds)
        self._flying = max(self._flying - 1, 0)
        self._in_flight.set(self._flying)

    def lease_lost(self, kind: str) -> None:
        self._leases_lost.labels(kind).inc()

    def taken_back(self, kind: str, requeued: bool) -> None:
        self._take_backs.labels(kind, "queued" if requeued else "ended").inc()

    def requeued(self, kind: str) -> None:
        self._requeues.labels(kind).inc()

    def ended(self, kind: str, reason: TerminationReason) -> None:
        self._ends.labels(kind, str(reason)).inc()

    def waited(self, kind: str, came_to: str) -> None:
        self._waits.labels(kind, came_to).inc()

    def signalled(self, kind: str, created: bool) -> None:
        self._signals.labels(kind, "yes" if created else "no").inc()

    def queue_depth(self, depths: Mapping[Band, int]) -> None:
        for band in Band:
            self._depth.labels(band_label(band)).set(depths.get(band, 0))

    def spent(self, workspace: str, kind: str, usage: Usage) -> None:
        labels = (workspace, kind, usage.provider or NO_NAME, usage.model or NO_NAME)
        if usage.input_tokens is not None:
            self._input_tokens.labels(*labels).inc(usage.input_tokens)
        if usage.output_tokens is not None:
            self._output_tokens.labels(*labels).inc(usage.output_tokens)
        if usage.cost is not None:
            self._cost.labels(*labels).inc(float(usage.cost))


HealthCheck = Callable[[], None]
"""Returns when the process is healthy; raises (any error, its message the reason) when not."""


def _healthy() -> None:
    return None


class MetricsServer:
    """The HTTP endpoint of one process: ``/metrics``, ``/healthz``, 404 elsewhere."""

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _WithoutCreated:
    """A registry's families without their ``*_created`` samples."""

    _TYPES = ("counter", "histogram", "summary", "gaugehistogram")

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            if family.type in self._TYPES:
                created = f"{family.name}_created"
                family.samples = [sample for sample in family.samples if sample.name != created]
            yield family


def serve(
    metrics: PrometheusMetrics,
    port: int,
    addr: str = "127.0.0.1",
    health: HealthCheck = _healthy,
    *,
    created: bool = False,
) -> MetricsServer:
    """Serve ``metrics`` and ``health`` at ``http://addr:port/`` from a daemon thread; with
    ``created``, the ``*_created`` series too.

    Raises :class:`OSError` when the port cannot be bound (in use, or not allowed)."""
    registry: CollectorRegistry | _WithoutCreated = (
        metrics.registry if created else _WithoutCreated(metrics.registry)
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                try:
                    health()
                except Exception as exc:  # the reason an operator (or a probe log) reads
                    reason = " ".join(str(exc).split()) or type(exc).__name__
                    self._answer(503, f"unhealthy: {reason}\n".encode())
                else:
                    self._answer(200, b"ok\n")
            else:
                self._answer(404, b"not found: /metrics and /healthz are served here\n")

        def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return None  # a scrape every few seconds is not worth a log line

    server = ThreadingHTTPServer((addr, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="agentruns-metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)
