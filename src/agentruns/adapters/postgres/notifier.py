"""Wake-up by LISTEN on channel ``agent_run``, on a connection of its own, with a poll fallback;
cancels heard on channel ``agent_run_cancel`` on the same connection (ADRs/0023).

The listening connection runs nothing else: a listener that shares its connection with queries
stalls them while it waits. Once it listens, a NOTIFY sent while nobody waits is queued on the
connection and wakes the next wait. Before that (the first wait, or after the connection broke)
a run may have been queued unheard, so the wait that opens the connection answers "woken" at
once and the caller claims. If the connection cannot be opened, :meth:`wait` sleeps out its time
instead (the poll fallback) and tries again on the next wait.

LISTEN needs a session of its own: through a transaction pooler it would listen on a server
connection that serves other clients between two transactions, and hear nothing of its own.
There the notifier listens on ``listen_url`` (a direct connection to the server), or, without
one, not at all: every wait sleeps out its time, and it says so once.

A cancel of a leased run sends its id on ``agent_run_cancel`` in the cancel's transaction. The
one listening connection hears both channels: a wait that reads a cancel calls the
:meth:`~PostgresNotifier.on_cancel` subscribers and goes on waiting for a wake-up, so a cancel
never costs a claim. Cancels are read only while some worker waits on the notifier (a worker's
loop waits whenever it is not claiming); one sent while the connection was down is missed, and
the holder's heartbeat finds the end instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from uuid import UUID

import psycopg

from agentruns.adapters.postgres.connections import ConnectionOptions, libpq_url
from agentruns.app.ports import CancelSubscribers, Notifier

CHANNEL = "agent_run"
CANCEL_CHANNEL = "agent_run_cancel"

log = logging.getLogger("agentruns.notifier")


class PostgresNotifier(Notifier):
    """Wake-ups by LISTEN on ``agent_run`` (see the module docstring for the fallbacks)."""

    def __init__(self, url: str, options: ConnectionOptions | None = None) -> None:
        self._options = (options or ConnectionOptions()).on(url)
        target = self._options.listen_url
        if target is None and self._options.pooler == "transaction":
            self._url: str | None = None  # nowhere to listen: poll
        else:
            self._url = libpq_url(target or url)
        self._warned = False
        self._connection: psycopg.AsyncConnection[object] | None = None
        self._lock = asyncio.Lock()
        self._cancels = CancelSubscribers()

    def on_cancel(self, callback: Callable[[UUID], None]) -> Callable[[], None]:
        return self._cancels.subscribe(callback)

    def _cancelled(self, payload: str) -> None:
        try:
            run_id = UUID(payload)
        except ValueError:
            log.warning("a cancel notification without a run id: %r", payload[:100])
            return
        self._cancels.tell(run_id)

    @property
    def listens(self) -> bool:
        """Whether this notifier LISTENs at all (False: every wait polls)."""
        return self._url is not None

    def _polling(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "no LISTEN through a transaction pooler: wake-ups fall back to polling every "
                "%g s; set AGENTRUNS_LISTEN_URL to a direct (non-pooled) URL to be woken",
                self._options.poll_interval,
                extra={"poll_interval": self._options.poll_interval},
            )

    async def _listening(self) -> psycopg.AsyncConnection[object] | None:
        """Open a connection that LISTENs on the channel; None when the server is unreachable
        (or there is nowhere to listen)."""
        if self._url is None:
            self._polling()
            return None
        connection: psycopg.AsyncConnection[object] | None = None
        try:
            connection = await psycopg.AsyncConnection.connect(
                self._url,
                autocommit=True,
                application_name=self._options.application_name,
            )
            await connection.execute(f"LISTEN {CHANNEL}")
            await connection.execute(f"LISTEN {CANCEL_CHANNEL}")
        except (psycopg.Error, OSError):
            if connection is not None:
                await connection.close()
            return None
        self._connection = connection
        return connection

    def _open(self) -> psycopg.AsyncConnection[object] | None:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        return None

    async def listen(self) -> bool:
        """Start listening now (so no NOTIFY after this call is missed); False if unreachable."""
        async with self._lock:
            return self._open() is not None or await asyncio.shield(self._listening()) is not None

    async def wait(self, seconds: float) -> bool:
        async with self._lock:
            connection = self._open()
            if connection is None:
                # Shielded: a caller that gives up waiting must not cut a connect in half.
                if await asyncio.shield(self._listening()) is not None:
                    return True  # a run may have been queued before we listened: claim now
                await asyncio.sleep(seconds)
                return False
            loop = asyncio.get_running_loop()
            deadline = loop.time() + seconds
            try:
                # The timeout bounds the whole wait: a cancel read on the way is told to its
                # subscribers and the wait goes on; only a wake-up ends it early. Each batch
                # the server sent is read to its end (leaving it would drop the rest of it).
                while True:
                    woken = False
                    left = max(deadline - loop.time(), 0.001)
                    async for notify in connection.notifies(timeout=left, stop_after=1):
                        if notify.channel == CANCEL_CHANNEL:
                            self._cancelled(notify.payload)
                        else:
                            woken = True
                    if woken:
                        return True
                    if loop.time() >= deadline:
                        return False
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
