"""Wake-ups in memory: every waiter wakes when a run is queued (after the commit).

A wake-up that arrives while nobody waits is kept until the next wait, as notifications queue on
a PostgreSQL listening connection: a worker whose claim came back empty just before an enqueue
does not sleep through it. A spurious wake-up costs one empty claim.

A leased run ended under its holder (a cancel) is told to every :meth:`on_cancel` subscriber in
the process at once, after the commit (ADRs/0023).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from uuid import UUID

from agentruns.app.ports import Notifier

log = logging.getLogger("agentruns.notifier")


class MemoryNotifier(Notifier):
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._pending = False
        self._cancel_callbacks: list[Callable[[UUID], None]] = []

    def on_cancel(self, callback: Callable[[UUID], None]) -> Callable[[], None]:
        self._cancel_callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._cancel_callbacks:
                self._cancel_callbacks.remove(callback)

        return unsubscribe

    def cancelled(self, run_id: UUID) -> None:
        """Tell the subscribers that leased run ``run_id`` was ended under its holder."""
        for callback in list(self._cancel_callbacks):
            try:
                callback(run_id)
            except Exception:  # one subscriber's bug must not stop the others, nor the commit
                log.exception("a cancel subscriber failed")

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
