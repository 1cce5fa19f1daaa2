"""One in-memory database: a lock that serialises transactions and an undo log per transaction.

Transactions run one at a time (the strongest isolation there is), so the memory adapter never
needs ``SKIP LOCKED``: a concurrent claimer simply waits its turn. A transaction that raises is
rolled back by replaying its undo log; callbacks registered with :meth:`on_commit` (wake-ups) run
only after a commit, as PostgreSQL delivers NOTIFY only on commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Generic, TypeVar

from agentruns.app.ports import Transaction, TransactionScope

K = TypeVar("K")
V = TypeVar("V")

_MISSING = object()


class MemoryTransaction(Transaction):
    """An open memory transaction: what to undo on rollback and what to run on commit."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self._after_commit: list[Callable[[], None]] = []
        self.open = True

    def record_undo(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def on_commit(self, callback: Callable[[], None]) -> None:
        self._after_commit.append(callback)

    def _rollback(self, to: tuple[int, int] = (0, 0)) -> None:
        # A savepoint's rollback drops only the callbacks registered inside it, as PostgreSQL
        # drops the NOTIFYs of an aborted subtransaction and keeps its parent's.
        undo_to, callbacks_to = to
        while len(self._undo) > undo_to:
            self._undo.pop()()
        del self._after_commit[callbacks_to:]

    def _mark(self) -> tuple[int, int]:
        return len(self._undo), len(self._after_commit)

    def _commit(self) -> None:
        callbacks, self._after_commit = self._after_commit, []
        self._undo.clear()
        for callback in callbacks:
            callback()


class MemoryDatabase(TransactionScope):
    """The transaction scope every memory store of one family shares."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._current: MemoryTransaction | None = None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[MemoryTransaction]:
        async with self._lock:
            tx = MemoryTransaction()
            self._current = tx
            try:
                yield tx
            except BaseException:
                tx._rollback()
                raise
            else:
                tx._commit()
            finally:
                tx.open = False
                self._current = None

    def statement(self) -> AbstractAsyncContextManager[MemoryTransaction]:
        # One statement is one atomic write here too: a transaction of its own.
        return self.transaction()

    @asynccontextmanager
    async def savepoint(self, tx: Transaction) -> AsyncIterator[None]:
        open_tx = self.check(tx)
        mark = open_tx._mark()
        try:
            yield
        except BaseException:
            open_tx._rollback(to=mark)
            raise

    def check(self, tx: Transaction) -> MemoryTransaction:
        """The open transaction ``tx`` is, or a clear error for a closed or foreign one."""
        if tx is not self._current or not isinstance(tx, MemoryTransaction):
            raise RuntimeError(
                "a memory store was handed a transaction that is not this database's open one"
            )
        return tx


class MemoryTable(Generic[K, V]):
    """A dict whose writes are undone when their transaction rolls back."""

    def __init__(self, database: MemoryDatabase) -> None:
        self._database = database
        self._rows: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        return self._rows.get(key)

    def values(self) -> Iterator[V]:
        return iter(list(self._rows.values()))

    def items(self) -> Iterator[tuple[K, V]]:
        return iter(list(self._rows.items()))

    def __len__(self) -> int:
        return len(self._rows)

    def put(self, tx: Transaction, key: K, value: V) -> None:
        open_tx = self._database.check(tx)
        old = self._rows.get(key, _MISSING)
        self._rows[key] = value
        open_tx.record_undo(lambda: self._restore(key, old))

    def delete(self, tx: Transaction, key: K) -> None:
        open_tx = self._database.check(tx)
        if key not in self._rows:
            return
        old = self._rows.pop(key)
        open_tx.record_undo(lambda: self._restore(key, old))

    def _restore(self, key: K, old: object) -> None:
        if old is _MISSING:
            self._rows.pop(key, None)
        else:
            self._rows[key] = old  # type: ignore[assignment]
