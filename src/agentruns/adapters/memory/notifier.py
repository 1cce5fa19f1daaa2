"""Wake-ups in memory: every waiter wakes when a run is queued (after the commit)."""

from __future__ import annotations

import asyncio

from agentruns.app.ports import Notifier


class MemoryNotifier(Notifier):
    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, seconds: float) -> bool:
        event = self._event
        try:
            async with asyncio.timeout(seconds):
                await event.wait()
        except TimeoutError:
            return False
        return True
