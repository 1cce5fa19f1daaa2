"""Who holds what: each holder's heartbeat, and the operator's view of holders and quiet leases.

A worker (and a gateway, for the sandboxes it serves) runs a :class:`HolderHeartbeat` beside its
loop: a row written when it starts, again about every ``renewal`` on a timer of its own (one row
per process, never on the claim path), marked stopped when it shuts down cleanly. A failed write
is logged and tried again at the next beat: the holder's work never waits on its heartbeat.

:class:`AgentHolders` answers ``agentruns status`` and the console's overview from the rows, the
leases that may be quiet and the queued kinds; the domain judges them
(:func:`agentruns.domain.holders.view_holders`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import timedelta

from agentruns.app.ports import HolderStore, RunStore, TransactionScope
from agentruns.app.stats import RunStats
from agentruns.domain.holders import (
    HOLDER_RETENTION,
    HolderBeat,
    HolderView,
    lease_scan,
    view_holders,
)

log = logging.getLogger("agentruns.holders")

#: The most leases a view reads that may be quiet (the oldest renewed first).
MAX_SCANNED_LEASES = 500


class HolderHeartbeat:
    """Keeps one holder's row: :meth:`start`, then :meth:`run` until its stop event, then
    :meth:`stop`. Each write is one statement; none raises (a failure is a warning line)."""

    def __init__(self, scope: TransactionScope, store: HolderStore, beat: HolderBeat) -> None:
        if beat.renewal <= timedelta(0):
            raise ValueError("a holder's heartbeat needs a renewal above zero")
        self._scope = scope
        self._store = store
        self.beat = beat

    @contextlib.asynccontextmanager
    async def kept(self) -> AsyncIterator[None]:
        """Start, beat while the block runs, and mark the holder stopped when the block ends
        without an error (after one, the row goes quiet and the holder is gone within three
        renewals)."""
        await self.start()
        until = asyncio.Event()
        beating = asyncio.create_task(self.run(until))
        try:
            yield
        finally:
            until.set()
            await beating
        await self.stop()

    async def start(self) -> bool:
        """Write the row of a holder that starts now, and forget holders gone for a day."""
        try:
            async with self._scope.transaction() as tx:
                await self._store.forget(tx, HOLDER_RETENTION)
                await self._store.started(tx, self.beat)
        except Exception as error:
            self._failed("start", error)
            return False
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Say the holder is alive about every ``renewal`` until ``stop`` is set."""
        every = self.beat.renewal.total_seconds()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
            if stop.is_set():
                return
            try:
                async with self._scope.statement() as tx:
                    await self._store.seen(tx, self.beat)
            except Exception as error:
                self._failed("beat", error)

    async def stop(self) -> None:
        """Mark the holder stopped: it is gone at once, and so are the leases it left."""
        try:
            async with self._scope.statement() as tx:
                await self._store.stopped(tx, self.beat.holder)
        except Exception as error:
            self._failed("stop", error)

    def _failed(self, what: str, error: Exception) -> None:
        # One line: the holder's work goes on; the operator sees it gone until a beat holds.
        log.warning(
            "holder %s failed: %s: %s",
            what,
            type(error).__name__,
            " ".join(str(error).split())[:300],
            extra={"holder": self.beat.holder},
        )


class AgentHolders:
    """The holders as an operator sees them: live and gone holders, quiet leases, and queued
    kinds no live holder claims. ``renewal`` is what a lease whose holder writes no row (a
    host's own claim loop, a sandbox) is expected to renew within, three times over."""

    def __init__(
        self,
        scope: TransactionScope,
        runs: RunStore,
        store: HolderStore,
        stats: RunStats,
        *,
        renewal: timedelta,
    ) -> None:
        self._scope = scope
        self._runs = runs
        self._store = store
        self._stats = stats
        self._renewal = renewal

    async def view(self) -> HolderView:
        async with self._scope.transaction() as tx:
            now = await self._runs.now(tx)
            rows = await self._store.all(tx)
            scan = lease_scan(now, rows, self._renewal)
            leases = await self._stats.held_leases(tx, scan, limit=MAX_SCANNED_LEASES)
            queued = await self._stats.queued_kinds(tx)
        return view_holders(now, rows, leases, queued, default_renewal=self._renewal)
