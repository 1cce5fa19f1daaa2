"""``AgentRunReaper``: takes back expired leases and ends overdue runs, on every replica.

No leader: replicas share the work because the store lists expired leases with ``SKIP LOCKED``.
Runs of kinds without a domain row are taken back set-based, a batch in one transaction that
keeps the listed rows locked, each row still conditional on its epoch and expiry (ADRs/0013), so a
renewal that committed first wins. For a kind with a domain row, each take-back is one
conditional write in its own transaction: the kind's handler locks its domain row, moves it
while the run still reads as its lost holder left it, and then the run is taken back; if a
renewal or another replica won meanwhile, the transaction rolls back. A take-back that fails is
skipped until the next tick.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from agentruns.app.kinds import RunKinds
from agentruns.app.metrics import Metrics, NoMetrics
from agentruns.app.ports import Stores, TakeBack, Transaction
from agentruns.domain import run as transitions
from agentruns.domain.backoff import RandomSource
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason

log = logging.getLogger("agentruns.reaper")


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


class AgentRunReaper:
    def __init__(
        self,
        stores: Stores,
        kinds: RunKinds,
        rng: RandomSource,
        *,
        batch: int = 500,
        metrics: Metrics | None = None,
    ) -> None:
        self._stores = stores
        self._kinds = kinds
        self._rng = rng
        self._batch = batch
        self._metrics = metrics or NoMetrics()

    async def tick(self) -> ReapReport:
        """One pass: every expired lease and every overdue queued run seen now."""
        counts = _Counts()
        taken: list[AgentRun] = []
        expired: list[AgentRun] = []
        bulk: list[AgentRun] = []
        try:
            async with self._stores.scope.transaction() as tx:
                # The listed rows stay locked until the batch is written: another replica
                # skips them and takes the next ones.
                expired = await self._stores.runs.expired(tx, self._batch)
                bulk = [run for run in expired if self._in_bulk(run)]
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
            if self._in_bulk(run):
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
            overdue = await self._stores.runs.overdue(tx, self._batch)
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
        return ReapReport(
            taken_back=counts.requeued + counts.ended,
            requeued=counts.requeued,
            ended=counts.ended,
            overdue_ended=overdue_ended,
            lost_races=counts.lost,
            failed=counts.failed,
        )

    def _count(self, counts: _Counts, after: AgentRun) -> None:
        if after.state is AgentRunState.QUEUED:
            counts.requeued += 1
        else:
            counts.ended += 1
            if after.end_reason is not None:
                self._metrics.ended(after.kind, after.end_reason)
        self._metrics.taken_back(after.kind, after.state is AgentRunState.QUEUED)

    def _in_bulk(self, run: AgentRun) -> bool:
        """A run of a kind without a domain row (``handler.has_domain_row``) is taken back
        set-based, its hooks skipped; an unknown kind is left to the one-run path, which says
        so."""
        return run.kind in self._kinds and not self._kinds.get(run.kind).handler.has_domain_row

    async def _take_back_many(self, tx: Transaction, runs: list[AgentRun]) -> list[AgentRun]:
        """One statement for the batch; each run's delay drawn as the one-run path draws it."""
        if not runs:
            return []
        take_backs = []
        for run in runs:
            policy = self._kinds.get(run.kind).policy
            delay = policy.backoff.delay(run.attempt + 1, self._rng)
            take_backs.append(TakeBack(run.id, run.epoch, policy.retry_budget, delay))
        taken = await self._stores.runs.take_back_many(tx, take_backs)
        for after in taken:
            log.info("lease taken back", extra={**_context(after), "to": str(after.state)})
        return taken

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


def _context(run: AgentRun) -> dict[str, object]:
    return {
        "run_id": str(run.id),
        "kind": run.kind,
        "workspace": run.workspace,
        "subject": run.subject,
        "epoch": run.epoch,
    }
