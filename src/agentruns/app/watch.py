"""Watching a run: its events and state changes as they are committed, until it ends
(ADRs/0030).

A watcher subscribes to the run on the process's notifier (one listening connection feeds every
watcher of the process), says so to the store (so PostgreSQL announces the run's commits), and
then reads: the run, then its events after the last one it handed out. It reads again only when
the notifier says the run may have changed, so a watcher costs nothing while its run is idle.
What it hands out comes from committed rows read after the subscription, so nothing is lost
between two reads, nothing is handed out twice, and a zombie holder's refused write (never
committed) is never seen.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from agentruns.app.ports import RunEvent, Stores
from agentruns.domain import limits
from agentruns.domain.errors import InvalidRequest, RunNotFound, RunWaitTimedOut
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState

log = logging.getLogger("agentruns.watch")

# Events read at a time: a watcher that resumes far back pages through them.
_PAGE = 500
# How often a watcher reads again when the notifier cannot listen (through a transaction
# pooler without a listen URL, or a server that cannot be reached): the poll fallback.
DEFAULT_POLL = 1.0
# The longest wait runs.wait accepts: a day.
_MAX_WAIT = 86_400.0
# Watch rows being removed, kept referenced until they are.
_removals: set[asyncio.Future[None]] = set()


@dataclass(frozen=True, slots=True)
class RunUpdate:
    """One item of :meth:`AgentRuns.watch <agentruns.app.runs.AgentRuns.watch>`: an event of
    the run (``event``), or its state after a change (``event`` is ``None``). ``run`` is the run
    as last read. The last item of a watch has ``ended`` True, and its ``run`` carries the end
    reason and the result."""

    run: AgentRun
    event: RunEvent | None = None

    @property
    def ended(self) -> bool:
        """Whether this is the last item: the run's end."""
        return self.event is None and self.run.state is AgentRunState.ENDED

    @property
    def seq(self) -> int | None:
        """The event's number (resume after it with ``after=seq``); ``None`` for a state."""
        return None if self.event is None else self.event.seq


def after_seq(after: object) -> int:
    """Check a resume point: a whole number of events, 0 for the first."""
    if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= limits.MAX_EPOCH:
        raise InvalidRequest(f"after is an event number (0 or more), not {limits.shown(after)}")
    return after


def wait_seconds(timeout: object) -> float | None:
    """Check runs.wait's timeout: seconds or a timedelta, above zero and at most a day."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise InvalidRequest(f"a timeout is seconds or a timedelta, not {limits.shown(timeout)}")
    if not 0 < seconds <= _MAX_WAIT:
        raise InvalidRequest(f"a timeout is above 0 and at most a day, not {seconds:g} s")
    return seconds


class RunWatcher:
    """The reader's watch of runs over one family's stores: :meth:`watch` and :meth:`wait`.

    Guarantees: items in commit order of the run's events (by ``seq``), each event once; a state
    item whenever the state or epoch read differs from the last one handed out; the run's end
    last, after all its events. A watch holds no database connection between reads."""

    def __init__(self, stores: Stores, *, poll: float = DEFAULT_POLL) -> None:
        self._stores = stores
        self._poll = poll

    async def watch(
        self, run_id: UUID, *, after: int = 0, events: bool = True
    ) -> AsyncGenerator[RunUpdate, None]:
        limits.run_id(run_id)
        seq = after_seq(after)
        stores = self._stores
        changed = asyncio.Event()
        unsubscribe = stores.notifier.on_run(run_id, changed.set)
        watcher = uuid.uuid4()
        registered = False
        try:
            # Listening first, then registered, then read: a commit after the read is heard.
            listening = await stores.notifier.listen()
            async with stores.scope.transaction() as tx:
                await stores.runs.watch(tx, run_id, watcher)
                registered = True
                if seq > 0 and events:
                    found = await stores.events.list(tx, run_id, after_seq=seq - 1, limit=1)
                    if not found or found[0].seq != seq:
                        raise InvalidRequest(f"run {run_id} has no event {seq} to resume after")
            shown: tuple[AgentRunState, int] | None = None
            while True:
                changed.clear()
                async with stores.scope.transaction() as tx:
                    run = await stores.runs.get(tx, run_id)
                    if run is None:
                        raise RunNotFound(f"no run {run_id}")
                    page = (
                        await stores.events.list(tx, run_id, after_seq=seq, limit=_PAGE)
                        if events
                        else []
                    )
                # Events of earlier epochs, then the new state, then the current epoch's events;
                # the end comes after every event (none is appended once the run has ended).
                now = (run.state, run.epoch)
                ended = run.state is AgentRunState.ENDED
                for event in page:
                    if now != shown and not ended and event.epoch >= run.epoch:
                        yield RunUpdate(run)
                        shown = now
                    yield RunUpdate(run, event)
                    seq = event.seq
                if len(page) == _PAGE:
                    continue  # more to read at once
                if now != shown:
                    yield RunUpdate(run)
                    shown = now
                if ended:
                    return
                if listening:
                    await changed.wait()
                else:
                    try:
                        async with asyncio.timeout(self._poll):
                            await changed.wait()
                    except TimeoutError:
                        pass
                    listening = await stores.notifier.listen()
        finally:
            unsubscribe()
            if registered:
                # Shielded: a watcher cancelled (a client gone) still removes its row.
                removal = asyncio.ensure_future(self._unwatch(run_id, watcher))
                _removals.add(removal)
                removal.add_done_callback(_removals.discard)
                await asyncio.shield(removal)

    async def _unwatch(self, run_id: UUID, watcher: UUID) -> None:
        try:
            async with self._stores.scope.transaction() as tx:
                await self._stores.runs.unwatch(tx, run_id, watcher)
        except Exception:  # the row only costs announcements until the run ends or is purged
            log.warning("a watch of run %s was not removed", run_id, exc_info=True)

    async def wait(
        self,
        run_id: UUID,
        *,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 - it names the run in its error
    ) -> AgentRun:
        seconds = wait_seconds(timeout)
        limits.run_id(run_id)
        last: AgentRun | None = None
        updates = self.watch(run_id, events=False)
        try:
            async with asyncio.timeout(seconds):
                async for update in updates:
                    last = update.run
                    if update.ended:
                        return update.run
        except TimeoutError:
            if last is None:  # timed out before the first read came back
                async with self._stores.scope.transaction() as tx:
                    last = await self._stores.runs.get(tx, run_id)
                if last is None:
                    raise RunNotFound(f"no run {run_id}") from None
            raise RunWaitTimedOut(last, seconds or 0.0) from None
        finally:
            await updates.aclose()
        raise AssertionError("a watch ends only with its run")  # pragma: no cover
