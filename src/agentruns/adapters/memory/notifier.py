"""Wake-ups in memory: every waiter wakes when a run is queued (after the commit).

A wake-up that arrives while nobody waits is kept until the next wait, as notifications queue on
a PostgreSQL listening connection: a worker whose claim came back empty just before an enqueue
does not sleep through it. A spurious wake-up costs one empty claim.
"""

from __future__ import annotations

import asyncio

from agentruns.app.ports import Notifier


class MemoryNotifier(Notifier):
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._pending = False

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
