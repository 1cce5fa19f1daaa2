"""Wake-ups in memory: every waiter wakes when a run is queued (after the commit).

A wake-up that arrives while nobody waits is kept until the next wait, as notifications queue on
a PostgreSQL listening connection: a worker whose claim came back empty just before an enqueue
does not sleep through it. A spurious wake-up costs one empty claim.

A leased run ended under its holder (a cancel) is told to every :meth:`on_cancel` subscriber in
the process at once, after the commit (ADRs/0023). A watched run's commits are told to its
:meth:`on_run` subscribers, after the commit (ADRs/0030).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from uuid import UUID

from agentruns.app.ports import CancelSubscribers, Notifier, RunSubscribers


class MemoryNotifier(Notifier):
    """Wake-ups, cancels and watched runs' changes of one memory family, told after commit."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._pending = False
        self._cancels = CancelSubscribers()
        self._runs = RunSubscribers()

    def on_run(self, run_id: UUID, callback: Callable[[], None]) -> Callable[[], None]:
        return self._runs.subscribe(run_id, callback)

    def watched(self, run_id: UUID) -> bool:
        """Whether some watcher of this process watches run ``run_id``."""
        return self._runs.watched(run_id)

    def changed(self, run_id: UUID) -> None:
        """Tell run ``run_id``'s watchers that it changed (a commit wrote it)."""
        self._runs.tell(run_id)

    def on_cancel(self, callback: Callable[[UUID], None]) -> Callable[[], None]:
        return self._cancels.subscribe(callback)

    def cancelled(self, run_id: UUID) -> None:
        """Tell the subscribers that leased run ``run_id`` was ended under its holder."""
        self._cancels.tell(run_id)

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        self._pending = True
        event.set()

    async def wait(self, seconds: float) -> bool:
        if self._pending:
            self._pending = False
            return True
        event = self._event
        try:
            async with asyncio.timeout(seconds):
                await event.wait()
        except TimeoutError:
            return False
        self._pending = False
        return True
