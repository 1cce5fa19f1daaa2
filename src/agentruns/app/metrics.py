"""The metrics port: what the worker and the reaper count and time, whatever records it.

The default records nothing (:class:`NoMetrics`); the container swaps in the Prometheus adapter
when a process exposes metrics. A lost lease is counted apart from a failure: it is not the
work's fault, and an operator reads a rise in lost leases as slow steps or a stalled worker.
Labels stay bounded: a kind is one the process registered, a band one of three, an outcome one
of :class:`~agentruns.domain.termination.RunOutcome`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from agentruns.app.ports import TransactionScope
from agentruns.app.stats import RunStats
from agentruns.domain.bands import Band
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome, TerminationReason
from agentruns.domain.usage import Usage

log = logging.getLogger("agentruns.metrics")


class Metrics(Protocol):
    def claimed(self, runs: Sequence[AgentRun], seconds: float) -> None:
        """One claim statement leased ``runs`` (maybe none) and took ``seconds``. Each run says
        when it was due and when it was leased (``leased_until - lease``, both on the store's
        clock), so its queue wait needs no clock of this process."""
        ...

    def renewed(self, kind: str) -> None: ...

    def stepped(self, kind: str, seconds: float) -> None:
        """One step of a run of ``kind`` took ``seconds``: its work and its boundary write."""
        ...

    def finished(self, kind: str, outcome: RunOutcome, seconds: float) -> None:
        """One attempt of a run of ``kind`` came to ``outcome`` ``seconds`` after its claim."""
        ...

    def lease_lost(self, kind: str) -> None:
        """A holder found its lease gone (taken back, or cancelled) and stopped."""
        ...

    def taken_back(self, kind: str, requeued: bool) -> None:
        """The reaper took back an expired lease: queued again, or ended."""
        ...

    def requeued(self, kind: str) -> None:
        """A holder gave a failed run back to the queue (a charged requeue)."""
        ...

    def ended(self, kind: str, reason: TerminationReason) -> None: ...

    def waited(self, kind: str, came_to: str) -> None:
        """A holder's wait or sleep (ADRs/0025) came to ``came_to``: ``waiting`` (the run was
        given back to wait), ``signalled`` (a signal answered it), ``timed_out`` (its timeout
        passed first) or ``slept`` (a sleep ended)."""
        ...

    def signalled(self, kind: str, created: bool) -> None:
        """A signal was delivered to a run of ``kind`` (ADRs/0025): kept (``created``), or a
        delivery of an id the run had seen, which wrote nothing."""
        ...

    def queue_depth(self, depths: Mapping[Band, int]) -> None:
        """Queued runs by band, as last seen."""
        ...

    def spent(self, workspace: str, kind: str, usage: Usage) -> None:
        """A step boundary of a run of ``kind`` in ``workspace`` that reported ``usage`` was
        written (ADRs/0033)."""
        ...


class NoMetrics(Metrics):
    """Records nothing: the default when no process exposes metrics."""

    def claimed(self, runs: Sequence[AgentRun], seconds: float) -> None:
        return None

    def renewed(self, kind: str) -> None:
        return None

    def stepped(self, kind: str, seconds: float) -> None:
        return None

    def finished(self, kind: str, outcome: RunOutcome, seconds: float) -> None:
        return None

    def lease_lost(self, kind: str) -> None:
        return None

    def taken_back(self, kind: str, requeued: bool) -> None:
        return None

    def requeued(self, kind: str) -> None:
        return None

    def ended(self, kind: str, reason: TerminationReason) -> None:
        return None

    def waited(self, kind: str, came_to: str) -> None:
        return None

    def signalled(self, kind: str, created: bool) -> None:
        return None

    def queue_depth(self, depths: Mapping[Band, int]) -> None:
        return None

    def spent(self, workspace: str, kind: str, usage: Usage) -> None:
        return None


async def sample_queue_depth(
    stats: RunStats, scope: TransactionScope, metrics: Metrics, stop: asyncio.Event, every: float
) -> None:
    """Set the queue depth gauge from the read model every ``every`` seconds until ``stop``."""
    while not stop.is_set():
        try:
            async with scope.transaction() as tx:
                status = await stats.status(tx)
            metrics.queue_depth(
                {band: status.total(AgentRunState.QUEUED, band=band) for band in Band}
            )
        except Exception:  # a metric must never stop the process it observes
            log.exception("sampling the queue depth failed")
        try:
            async with asyncio.timeout(every):
                await stop.wait()
        except TimeoutError:
            pass
