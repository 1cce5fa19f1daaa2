"""The memory transaction scope: undo on failure, savepoints, on-commit callbacks, one at a time."""

from __future__ import annotations

import asyncio
from uuid import uuid4

import pytest

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.memory import (
    MemoryDatabase,
    MemoryTable,
    MemoryTransaction,
    make_memory_stores,
)
from agentruns.app.ports import Transaction


class Boom(Exception):
    """The failure a test raises inside a transaction."""


async def seeded(database: MemoryDatabase) -> MemoryTable[str, int]:
    table: MemoryTable[str, int] = MemoryTable(database)
    async with database.transaction() as tx:
        table.put(tx, "kept", 1)
        table.put(tx, "doomed", 2)
    return table


async def test_a_failing_transaction_undoes_every_write() -> None:
    """Inserts, updates and deletes of a transaction that raises are all undone."""
    database = MemoryDatabase()
    table = await seeded(database)

    async def failing() -> None:
        async with database.transaction() as tx:
            table.put(tx, "new", 3)
            table.put(tx, "kept", 10)
            table.put(tx, "kept", 11)
            table.delete(tx, "doomed")
            raise Boom

    with pytest.raises(Boom):
        await failing()

    assert dict(table.items()) == {"kept": 1, "doomed": 2}


async def test_a_cancelled_transaction_is_rolled_back() -> None:
    """A task cancelled inside a transaction leaves nothing of it behind."""
    database = MemoryDatabase()
    table = await seeded(database)
    wrote = asyncio.Event()

    async def writer() -> None:
        async with database.transaction() as tx:
            table.put(tx, "kept", 10)
            wrote.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(writer())
    await wrote.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert dict(table.items()) == {"kept": 1, "doomed": 2}


async def test_a_savepoint_undoes_only_its_own_writes() -> None:
    """An error inside a savepoint undoes what the savepoint wrote and keeps the rest."""
    database = MemoryDatabase()
    table = await seeded(database)

    async def failing_savepoint(tx: Transaction) -> None:
        async with database.savepoint(tx):
            table.put(tx, "inside", 2)
            table.put(tx, "before", 20)
            table.delete(tx, "kept")
            raise Boom

    async with database.transaction() as tx:
        table.put(tx, "before", 1)
        with pytest.raises(Boom):
            await failing_savepoint(tx)
        async with database.savepoint(tx):
            table.put(tx, "released", 3)
        table.put(tx, "after", 4)

    assert dict(table.items()) == {
        "kept": 1,
        "doomed": 2,
        "before": 1,
        "released": 3,
        "after": 4,
    }


async def test_on_commit_callbacks_run_only_after_a_commit() -> None:
    """Callbacks wait for the commit; a rollback, or a rolled-back savepoint, drops them."""
    database = MemoryDatabase()
    ran: list[str] = []

    async def failing_savepoint(tx: MemoryTransaction) -> None:
        async with database.savepoint(tx):
            tx.on_commit(lambda: ran.append("rolled back savepoint"))
            raise Boom

    async def failing() -> None:
        async with database.transaction() as tx:
            tx.on_commit(lambda: ran.append("rolled back"))
            raise Boom

    async with database.transaction() as tx:
        tx.on_commit(lambda: ran.append("committed"))
        with pytest.raises(Boom):
            await failing_savepoint(tx)
        async with database.savepoint(tx):
            tx.on_commit(lambda: ran.append("released savepoint"))
        assert ran == []
    assert ran == ["committed", "released savepoint"]

    with pytest.raises(Boom):
        await failing()
    assert ran == ["committed", "released savepoint"]


async def test_a_store_handed_a_closed_transaction_refuses_it() -> None:
    """A transaction used after its block ended, or one of another database, raises."""
    database = MemoryDatabase()
    table: MemoryTable[str, int] = MemoryTable(database)
    async with database.transaction() as closed:
        pass

    with pytest.raises(RuntimeError):
        table.put(closed, "late", 1)
    with pytest.raises(RuntimeError):
        async with database.savepoint(closed):
            pass

    stores = make_memory_stores(ManualClock())
    with pytest.raises(RuntimeError):
        await stores.runs.get(closed, uuid4())
    async with database.transaction() as foreign:
        with pytest.raises(RuntimeError):
            await stores.runs.get(foreign, uuid4())
    assert len(table) == 0


async def test_two_concurrent_transactions_are_serialised() -> None:
    """A second transaction waits until the first has committed, and then sees its writes."""
    database = MemoryDatabase()
    table: MemoryTable[str, int] = MemoryTable(database)
    order: list[str] = []
    first_inside = asyncio.Event()
    let_first_finish = asyncio.Event()

    async def first() -> None:
        async with database.transaction() as tx:
            order.append("first begins")
            table.put(tx, "counter", 1)
            first_inside.set()
            await let_first_finish.wait()
            order.append("first commits")

    async def second() -> None:
        async with database.transaction() as tx:
            order.append("second begins")
            table.put(tx, "counter", (table.get("counter") or 0) + 1)

    one = asyncio.create_task(first())
    await first_inside.wait()
    two = asyncio.create_task(second())
    for _ in range(5):  # give the second every chance to (wrongly) start
        await asyncio.sleep(0)
    assert order == ["first begins"]

    let_first_finish.set()
    await asyncio.gather(one, two)
    assert order == ["first begins", "first commits", "second begins"]
    assert table.get("counter") == 2


async def test_a_wake_up_sent_while_nobody_waits_is_kept_for_the_next_wait() -> None:
    """An enqueue between a worker's empty claim and its wait does not leave it sleeping."""
    from agentruns.adapters.memory import MemoryNotifier

    notifier = MemoryNotifier()
    notifier.notify()
    assert await notifier.wait(30.0) is True
    assert await notifier.wait(0.01) is False
