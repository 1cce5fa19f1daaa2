"""``AgentRunReaper``: takes back expired leases and ends overdue runs, on every replica.

No leader: replicas share the work because the store lists expired leases with ``SKIP LOCKED``.
Runs of kinds without a domain row (``handler.has_domain_row``) are taken back set-based: the
batch is listed and written in one transaction that keeps its rows locked, so another replica
takes the next ones, and each row is still conditional on its epoch and expiry, so a renewal
that committed first wins (ADRs/0017). For a kind with a domain row, each take-back is one
conditional write in its own transaction: the kind's handler locks its domain row, moves it
while the run still reads as its lost holder left it, and then the run is taken back; if a
renewal or another replica won meanwhile, the transaction rolls back. A take-back that fails is
skipped until the next tick.

A reaper takes back only the kinds it knows: a run of another kind is left for a replica that
knows it (only its handler may move its domain row), and the reaper says so once per
``orphan_log_every`` with one warning line per such kind, never a traceback. Each take-back is
recorded on the run as a failed attempt of class ``lease_expired`` (ADRs/0014).

Each tick last moves the runs that ended out of the store's hot path (ADRs/0035), in batches
that replicas share as they share take-backs.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from agentruns.app.kinds import RunKinds
from agentruns.app.metrics import Metrics, NoMetrics
from agentruns.app.ports import NewFailure, Stores, TakeBack, Transaction
from agentruns.domain import run as transitions
from agentruns.domain.backoff import RandomSource
from agentruns.domain.failure_records import FailureDetail
from agentruns.domain.failures import FailureClass
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason

log = logging.getLogger("agentruns.reaper")

# Batches of ended runs one tick moves out of the hot path at most (ADRs/0035).
_ARCHIVE_BATCHES = 20


class _Lost(Exception):
    """A renewal or another replica won: roll the take-back's transaction back."""


@dataclass(slots=True)
class _Counts:
    requeued: int = 0
    ended: int = 0
    lost: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class ReapReport:
    taken_back: int = 0
    requeued: int = 0
    ended: int = 0
    overdue_ended: int = 0
    lost_races: int = 0
    failed: int = 0
    # Expired leases of kinds this reaper does not know, when it last looked (else 0).
    orphaned: int = 0
    # Ended runs moved out of the store's hot path (ADRs/0035).
    archived: int = 0


class AgentRunReaper:
    def __init__(
        self,
        stores: Stores,
        kinds: RunKinds,
        rng: RandomSource,
        *,
        batch: int = 500,
        metrics: Metrics | None = None,
        orphan_log_every: timedelta = timedelta(minutes=1),
    ) -> None:
        self._stores = stores
        self._kinds = kinds
        self._rng = rng
        self._batch = batch
        self._metrics = metrics or NoMetrics()
        self._orphan_log_every = orphan_log_every
        self._next_orphan_check: datetime | None = None

    async def tick(self) -> ReapReport:
        """One pass: every expired lease and every overdue queued run of a known kind seen now;
        once per ``orphan_log_every``, a warning per unknown kind with expired leases."""
        known = self._kinds.names()
        orphaned = 0
        counts = _Counts()
        taken: list[AgentRun] = []
        bulk: list[AgentRun] = []
        try:
            async with self._stores.scope.transaction() as tx:
                # The listed rows stay locked until the batch is written: another replica skips
                # them and takes the next ones.
                expired = await self._stores.runs.expired(tx, self._batch, kinds=known)
                now = await self._stores.runs.now(tx)
                if self._next_orphan_check is None or now >= self._next_orphan_check:
                    self._next_orphan_check = now + self._orphan_log_every
                    orphaned = await self._orphans(tx, known)
                bulk = [run for run in expired if not self._has_domain_row(run)]
                taken = await self._take_back_many(tx, bulk)
        except Exception:
            if not bulk:
                raise  # the listing itself failed: the tick fails, as it always did
            counts.failed += len(bulk)  # the whole batch waits for the next tick
            log.exception("set-based take-back failed; retried on the next tick")
        else:
            counts.lost += len(bulk) - len(taken)
        for after in taken:
            self._count(counts, after)
        for run in expired:
            if not self._has_domain_row(run):
                continue
            try:
                async with self._stores.scope.transaction() as tx:
                    after = await self._take_back(tx, run)
                self._count(counts, after)
            except _Lost:
                counts.lost += 1
            except Exception:  # skipped until the next tick; the others go on
                counts.failed += 1
                log.exception("take-back failed", extra=_context(run))
        async with self._stores.scope.transaction() as tx:
            overdue = await self._stores.runs.overdue(tx, self._batch, kinds=known)
        overdue_ended = 0
        for run in overdue:
            try:
                async with self._stores.scope.transaction() as tx:
                    if await self._end_overdue(tx, run):
                        overdue_ended += 1
                        self._metrics.ended(run.kind, TerminationReason.DEADLINE_EXCEEDED)
            except Exception:
                counts.failed += 1
                log.exception("ending an overdue run failed", extra=_context(run))
        archived = await self._archive(counts)
        return ReapReport(
            taken_back=counts.requeued + counts.ended,
            requeued=counts.requeued,
            ended=counts.ended,
            overdue_ended=overdue_ended,
            lost_races=counts.lost,
            failed=counts.failed,
            orphaned=orphaned,
            archived=archived,
        )

    async def _archive(self, counts: _Counts) -> int:
        """Move the runs that ended out of the hot path, a batch per transaction, until a batch
        comes back short (or ``_ARCHIVE_BATCHES`` were moved: the next tick goes on)."""
        moved = 0
        for _ in range(_ARCHIVE_BATCHES):
            try:
                async with self._stores.scope.transaction() as tx:
                    batch = await self._stores.runs.archive(tx, self._batch)
            except Exception:
                counts.failed += 1
                log.exception("moving ended runs failed; retried on the next tick")
                break
            moved += batch
            if batch < self._batch:
                break
        return moved

    def _count(self, counts: _Counts, after: AgentRun) -> None:
        if after.state is AgentRunState.QUEUED:
            counts.requeued += 1
        else:
            counts.ended += 1
            if after.end_reason is not None:
                self._metrics.ended(after.kind, after.end_reason)
        self._metrics.taken_back(after.kind, after.state is AgentRunState.QUEUED)

    def _has_domain_row(self, run: AgentRun) -> bool:
        """Whether the run's kind keeps a domain row, whose handler hooks the one-run path runs;
        a kind without one is taken back set-based. (Expired runs are of known kinds.)"""
        return self._kinds.get(run.kind).handler.has_domain_row

    async def _take_back_many(self, tx: Transaction, runs: list[AgentRun]) -> list[AgentRun]:
        """One statement for the batch, each run's failed attempt recorded with it; each run's
        delay drawn as the one-run path draws it."""
        if not runs:
            return []
        take_backs = []
        for run in runs:
            policy = self._kinds.get(run.kind).policy
            delay = policy.backoff.delay(run.attempt + 1, self._rng)
            take_backs.append(
                TakeBack(run.id, run.epoch, policy.retry_budget, delay, failure=_expired(run))
            )
        taken = await self._stores.runs.take_back_many(tx, take_backs)
        for after in taken:
            log.info("lease taken back", extra={**_context(after), "to": str(after.state)})
        return taken

    async def _orphans(self, tx: Transaction, known: list[str]) -> int:
        counted = await self._stores.runs.expired_kinds(tx, known)
        for kind, leases in counted.items():
            log.warning(
                "expired leases of a kind this reaper does not know: left for a reaper that "
                "registers it",
                extra={"kind": kind, "leases": leases, "known_kinds": ",".join(known)},
            )
        return sum(counted.values())

    async def _take_back(self, tx: Transaction, seen: AgentRun) -> AgentRun:
        kind = self._kinds.get(seen.kind)
        await kind.handler.lock_domain_row(tx, seen)
        run = await self._stores.runs.lock(tx, seen.id)
        now = await self._stores.runs.now(tx)
        if run is None or run.epoch != seen.epoch or not run.is_expired(now):
            raise _Lost
        delay = kind.policy.backoff.delay(run.attempt + 1, self._rng)
        change = transitions.take_back(
            run, now=now, retry_budget=kind.policy.retry_budget, delay=delay
        )
        await kind.handler.on_take_back(tx, run, change)
        await self._stores.runs.record_failure(tx, NewFailure(run.id, run.epoch, _expired(run)))
        after = await self._stores.runs.take_back(
            tx, TakeBack(run.id, run.epoch, kind.policy.retry_budget, delay)
        )
        if after is None:
            raise _Lost
        log.info("lease taken back", extra={**_context(run), "to": str(after.state)})
        return after

    async def _end_overdue(self, tx: Transaction, seen: AgentRun) -> bool:
        kind = self._kinds.get(seen.kind)
        await kind.handler.lock_domain_row(tx, seen)
        run = await self._stores.runs.lock(tx, seen.id)
        now = await self._stores.runs.now(tx)
        if run is None or run.state is not AgentRunState.QUEUED or not run.is_past_deadline(now):
            return False
        after = await self._stores.runs.end(tx, run.id, TerminationReason.DEADLINE_EXCEEDED, None)
        await kind.handler.on_moved(tx, after)
        log.info("queued run past its deadline ended", extra=_context(run))
        return True

    async def run(self, stop: asyncio.Event, *, every: float) -> None:
        """Tick every ``every`` seconds until ``stop`` is set; a failing tick is logged."""
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("reaper tick failed")
            try:
                async with asyncio.timeout(every):
                    await stop.wait()
            except TimeoutError:
                pass


def _expired(run: AgentRun) -> FailureDetail:
    """The failed attempt a take-back records: the holder stopped renewing (it died, stalled, or
    lost the store) until its lease ran out."""
    until = "" if run.leased_until is None else f" at {run.leased_until.isoformat()}"
    return FailureDetail(
        error_type="LeaseExpired",
        message=(
            f"the lease of {run.holder or 'its holder'} at epoch {run.epoch} expired{until}; "
            "the reaper took the run back"
        ),
        failure_class=FailureClass.LEASE_EXPIRED,
        traceback="",
    )


def _context(run: AgentRun) -> dict[str, object]:
    return {
        "run_id": str(run.id),
        "kind": run.kind,
        "workspace": run.workspace,
        "subject": run.subject,
        "epoch": run.epoch,
    }
