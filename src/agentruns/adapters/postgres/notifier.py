"""Wake-up by LISTEN on channel ``agent_run``, on a connection of its own, with a poll fallback;
cancels heard on channel ``agent_run_cancel`` and watched runs' changes on ``agent_run_watch``,
on the same connection (ADRs/0023, ADRs/0030).

The listening connection runs nothing else: a listener that shares its connection with queries
stalls them while it waits. One reader task per notifier reads every notification the connection
receives and hands it on: a wake-up is kept until the next :meth:`wait` (as a NOTIFY sent while
nobody waits is queued on a PostgreSQL connection), a cancel goes to the :meth:`on_cancel`
subscribers, a watched run's change to that run's :meth:`on_run` subscribers. Before the
connection listens (the first wait, or after it broke) a run may have been queued unheard, so
the wait that opens the connection answers "woken" at once and the caller claims; a connection
that breaks tells every run subscriber once (it may have missed their changes) and, while any
run is watched, is opened again after ``poll_interval``. If the connection cannot be opened,
:meth:`wait` sleeps out its time instead (the poll fallback) and tries again on the next wait.

LISTEN needs a session of its own: through a transaction pooler it would listen on a server
connection that serves other clients between two transactions, and hear nothing of its own.
There the notifier listens on ``listen_url`` (a direct connection to the server), or, without
one, not at all: every wait sleeps out its time, and it says so once.

A cancel of a leased run sends its id on ``agent_run_cancel`` in the cancel's transaction; one
sent while the connection was down is missed, and the holder's heartbeat finds the end instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from uuid import UUID

import psycopg

from agentruns.adapters.postgres.connections import ConnectionOptions, libpq_url
from agentruns.app.ports import CancelSubscribers, Notifier, RunSubscribers

CHANNEL = "agent_run"
CANCEL_CHANNEL = "agent_run_cancel"
WATCH_CHANNEL = "agent_run_watch"

log = logging.getLogger("agentruns.notifier")


class PostgresNotifier(Notifier):
    """Wake-ups, cancels and watched runs' changes from one LISTEN connection per process (see
    the module docstring for the fallbacks)."""

    def __init__(self, url: str, options: ConnectionOptions | None = None) -> None:
        self._options = (options or ConnectionOptions()).on(url)
        target = self._options.listen_url
        if target is None and self._options.pooler == "transaction":
            self._url: str | None = None  # nowhere to listen: poll
        else:
            self._url = libpq_url(target or url)
        self._warned = False
        self._connection: psycopg.AsyncConnection[object] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._reopen: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._woken = asyncio.Event()
        self._cancels = CancelSubscribers()
        self._runs = RunSubscribers()
        self._closed = False

    def on_cancel(self, callback: Callable[[UUID], None]) -> Callable[[], None]:
        return self._cancels.subscribe(callback)

    def on_run(self, run_id: UUID, callback: Callable[[], None]) -> Callable[[], None]:
        return self._runs.subscribe(run_id, callback)

    @staticmethod
    def _run_id(payload: str, channel: str) -> UUID | None:
        """The run a notification on ``channel`` names, or None (logged) if it names none."""
        try:
            return UUID(payload)
        except ValueError:
            log.warning("a notification on %s without a run id: %r", channel, payload[:100])
            return None

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
        """Open a connection that LISTENs on the channels and start its reader; None when the
        server is unreachable (or there is nowhere to listen)."""
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
            for channel in (CHANNEL, CANCEL_CHANNEL, WATCH_CHANNEL):
                await connection.execute(f"LISTEN {channel}")
        except (psycopg.Error, OSError):
            if connection is not None:
                await connection.close()
            return None
        self._connection = connection
        self._reader = asyncio.get_running_loop().create_task(self._read(connection))
        return connection

    def _open(self) -> psycopg.AsyncConnection[object] | None:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        return None

    async def _ensure(self) -> bool | None:
        """Listen: True if the connection was opened by this call, False if it was open
        already, None if it cannot be."""
        async with self._lock:
            if self._open() is not None:
                return False
            # Shielded: a caller that gives up waiting must not cut a connect in half.
            return None if await asyncio.shield(self._listening()) is None else True

    async def listen(self) -> bool:
        """Start listening now (so no NOTIFY after this call is missed); False if unreachable."""
        return await self._ensure() is not None

    async def wait(self, seconds: float) -> bool:
        opened = await self._ensure()
        if opened is None:
            await asyncio.sleep(seconds)
            return False
        if opened:
            return True  # a run may have been queued before we listened: claim now
        if not self._woken.is_set():
            try:
                async with asyncio.timeout(seconds):
                    await self._woken.wait()
            except TimeoutError:
                return False
        self._woken.clear()
        return True

    async def _read(self, connection: psycopg.AsyncConnection[object]) -> None:
        """Hand on every notification until the connection breaks or the notifier closes."""
        try:
            async for notify in connection.notifies():
                if notify.channel == CHANNEL:
                    self._woken.set()
                elif (run_id := self._run_id(notify.payload, notify.channel)) is None:
                    continue
                elif notify.channel == WATCH_CHANNEL:
                    self._runs.tell(run_id)
                else:  # CANCEL_CHANNEL: the three channels are the only ones it listens on
                    self._cancels.tell(run_id)
        except (psycopg.Error, OSError):
            pass
        if self._connection is connection:
            self._connection = None
            self._reader = None
            await connection.close()
            # What was sent while it was down is unknown: a waiting worker claims at once (its
            # next wait opens the connection again), and every watcher reads its run again.
            self._woken.set()
            self._runs.tell_all()
            if self._runs and not self._closed:
                self._reopen = asyncio.get_running_loop().call_later(
                    self._options.poll_interval, self._reconnect
                )

    def _reconnect(self) -> None:
        self._reopen = None
        if self._runs and not self._closed:
            task = asyncio.get_running_loop().create_task(self._reopened())
            _pending.add(task)
            task.add_done_callback(_pending.discard)

    async def _reopened(self) -> None:
        opened = await self._ensure()
        if opened is None and self._runs and not self._closed:
            self._reopen = asyncio.get_running_loop().call_later(
                self._options.poll_interval, self._reconnect
            )
        elif opened:
            self._runs.tell_all()

    async def _drop(self) -> None:
        reader, self._reader = self._reader, None
        connection, self._connection = self._connection, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        if connection is not None:
            await connection.close()

    async def close(self) -> None:
        self._closed = True
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        async with self._lock:
            await self._drop()


# Reconnection tasks in flight, kept referenced until they finish.
_pending: set[asyncio.Task[None]] = set()
