"""Wake-up by LISTEN on channel ``agent_run``, on a connection of its own, with a poll fallback.

The listening connection runs nothing else: a listener that shares its connection with queries
stalls them while it waits. If the connection cannot be opened or breaks, :meth:`wait` sleeps
out its time instead (the caller claims after either), and reconnects on the next wait.
"""

from __future__ import annotations

import asyncio

import psycopg

from agentruns.adapters.postgres.database import libpq_url
from agentruns.app.ports import Notifier

CHANNEL = "agent_run"


class PostgresNotifier(Notifier):
    def __init__(self, url: str) -> None:
        self._url = libpq_url(url)
        self._connection: psycopg.AsyncConnection[object] | None = None
        self._lock = asyncio.Lock()

    async def _listening(self) -> psycopg.AsyncConnection[object] | None:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        try:
            connection: psycopg.AsyncConnection[object] = await psycopg.AsyncConnection.connect(
                self._url, autocommit=True
            )
        except (psycopg.Error, OSError):
            return None
        try:
            await connection.execute(f"LISTEN {CHANNEL}")
        except BaseException as exc:
            # A waiter cancelled here (a worker stopping) must not leak the open connection.
            await connection.close()
            if isinstance(exc, psycopg.Error | OSError):
                return None
            raise
        self._connection = connection
        return connection

    async def listen(self) -> bool:
        """Open the listening connection now (so no NOTIFY after this call is missed)."""
        async with self._lock:
            return await self._listening() is not None

    async def wait(self, seconds: float) -> bool:
        async with self._lock:
            connection = await self._listening()
            if connection is None:
                await asyncio.sleep(seconds)
                return False
            try:
                async for _ in connection.notifies(timeout=max(seconds, 0.001), stop_after=1):
                    return True
            except (psycopg.Error, OSError):
                await self._drop()
            return False

    async def _drop(self) -> None:
        if self._connection is not None:
            await self._connection.close()
        self._connection = None

    async def close(self) -> None:
        async with self._lock:
            await self._drop()
