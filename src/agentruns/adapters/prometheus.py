"""Metrics for Prometheus: counters, a claim latency histogram and a queue depth gauge.

Each instance registers its series in its own registry unless handed one, so tests and several
containers in one process do not collide; :func:`serve` exposes a registry over HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from agentruns.app.metrics import Metrics
from agentruns.domain.bands import Band
from agentruns.domain.termination import TerminationReason

_CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class PrometheusMetrics(Metrics):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._claims = Counter("agentruns_claims", "Runs leased by claims", registry=self.registry)
        self._claim_seconds = Histogram(
            "agentruns_claim_seconds",
            "Time one claim statement took",
            buckets=_CLAIM_BUCKETS,
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
        self._depth = Gauge(
            "agentruns_queue_depth", "Queued runs by band", ["band"], registry=self.registry
        )

    def claimed(self, count: int, seconds: float) -> None:
        self._claims.inc(count)
        self._claim_seconds.observe(seconds)

    def renewed(self, kind: str) -> None:
        self._renewals.labels(kind).inc()

    def lease_lost(self, kind: str) -> None:
        self._leases_lost.labels(kind).inc()

    def taken_back(self, kind: str, requeued: bool) -> None:
        self._take_backs.labels(kind, "queued" if requeued else "ended").inc()

    def requeued(self, kind: str) -> None:
        self._requeues.labels(kind).inc()

    def ended(self, kind: str, reason: TerminationReason) -> None:
        self._ends.labels(kind, str(reason)).inc()

    def queue_depth(self, depths: Mapping[Band, int]) -> None:
        for band in Band:
            self._depth.labels(band.name.lower()).set(depths.get(band, 0))


def serve(metrics: PrometheusMetrics, port: int, addr: str = "127.0.0.1") -> None:
    """Expose ``metrics`` at ``http://addr:port/metrics`` from a daemon thread."""
    start_http_server(port, addr=addr, registry=metrics.registry)
