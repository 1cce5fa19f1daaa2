"""AgentSandboxReaper: every take-back rule, claims before rows, refused deletes, orphans."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agentruns.app.sandbox_ports import SANDBOX_ID_LABEL
from agentruns.domain.errors import SandboxNotLive
from agentruns.domain.sandbox import AgentSandbox, SandboxState
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from tests.contract.sandboxes.world import World

DONE = TerminationReason.COMPLETED


async def ready_sandbox(world: World, kind: str = "coder", subject: str = "task:1") -> AgentSandbox:
    sandbox = await world.sandboxes.ensure(kind, workspace="ws", subject=subject)
    return await world.sandboxes.call(await world.token_of(sandbox))


async def state_of(world: World, sandbox: AgentSandbox) -> SandboxState | None:
    row = await world.row(sandbox.id)
    return None if row is None else row.state


async def test_a_sandbox_that_never_calls_is_taken_back_after_the_start_limit(
    world: World,
) -> None:
    """Two minutes after its request without a call, its row and claim are deleted."""
    sandbox = await world.sandboxes.ensure("coder", workspace="ws", subject="task:1")
    await world.runs.enqueue("code", workspace="ws", subject="task:1")
    world.clock.advance(timedelta(minutes=2) - timedelta(seconds=1))
    reap = await world.reaper.tick()
    assert reap.taken_back == []
    world.clock.advance(timedelta(seconds=1))
    reap = await world.reaper.tick()
    assert [s.id for s in reap.taken_back] == [sandbox.id]
    assert reap.deleted == [sandbox.claim_name]
    assert await state_of(world, sandbox) is None
    assert world.cluster.names() == set()


async def test_an_idle_sandbox_is_taken_back_after_a_minute(world: World) -> None:
    """Its subject has no queued or leased run, and it leased none for a minute."""
    sandbox = await ready_sandbox(world)
    world.clock.advance(timedelta(seconds=59))
    assert (await world.reaper.tick()).taken_back == []
    world.clock.advance(timedelta(seconds=1))
    assert [s.id for s in (await world.reaper.tick()).taken_back] == [sandbox.id]
    assert world.cluster.names() == set()


async def test_polling_is_no_use_of_a_sandbox(world: World) -> None:
    """Calls that lease nothing do not keep it: it still goes idle."""
    sandbox = await ready_sandbox(world)
    token = await world.token_of(sandbox)
    for _ in range(6):
        world.clock.advance(timedelta(seconds=10))
        assert await world.sandboxes.next_run(token, world.runs) is None
    assert [s.id for s in (await world.reaper.tick()).taken_back] == [sandbox.id]


async def test_a_sandbox_whose_subject_has_queued_or_leased_work_is_not_idle(
    world: World,
) -> None:
    """A queued run, then a leased one, keep the sandbox; once the run ends it idles."""
    sandbox = await ready_sandbox(world)
    token = await world.token_of(sandbox)
    await world.runs.enqueue("chat", workspace="ws", subject="task:1")
    world.clock.advance(timedelta(minutes=1, seconds=30))
    assert (await world.reaper.tick()).taken_back == []
    chat = await world.runs.claim("worker-1", kinds=["chat"])
    world.clock.advance(timedelta(seconds=20))
    assert (await world.reaper.tick()).taken_back == []
    await world.runs.cancel(chat[0].id)
    assert [s.id for s in (await world.reaper.tick()).taken_back] == [sandbox.id]
    with pytest.raises(SandboxNotLive):
        await world.sandboxes.next_run(token, world.runs)


async def test_a_lease_restarts_the_idle_clock(world: World) -> None:
    """The idle minute counts from the sandbox's last lease."""
    sandbox = await ready_sandbox(world)
    token = await world.token_of(sandbox)
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    world.clock.advance(timedelta(seconds=50))
    leased = await world.sandboxes.next_run(token, world.runs)
    assert leased is not None
    assert leased.id == run.id
    await world.sandboxes.end(token, run.id, leased.epoch, DONE, world.runs)
    world.clock.advance(timedelta(seconds=59))
    assert (await world.reaper.tick()).taken_back == []
    world.clock.advance(timedelta(seconds=1))
    assert [s.id for s in (await world.reaper.tick()).taken_back] == [sandbox.id]


async def test_a_conversation_sandbox_idles_for_fifteen_minutes(world: World) -> None:
    """The conversation limit applies instead of the minute."""
    sandbox = await ready_sandbox(world, "talker", "chat:1")
    world.clock.advance(timedelta(minutes=14, seconds=59))
    assert (await world.reaper.tick()).taken_back == []
    world.clock.advance(timedelta(seconds=1))
    assert [s.id for s in (await world.reaper.tick()).taken_back] == [sandbox.id]


async def test_a_sandbox_past_its_shutdown_is_taken_back_even_with_work(world: World) -> None:
    """Shutdown ends a sandbox whatever its subject still has queued."""
    sandbox = await ready_sandbox(world)
    token = await world.token_of(sandbox)
    for _ in range(7):
        await world.runs.enqueue("code", workspace="ws", subject="task:1")
    for _ in range(6):
        world.clock.advance(timedelta(minutes=9, seconds=59))
        leased = await world.sandboxes.next_run(token, world.runs)
        assert leased is not None
        await world.sandboxes.end(
            token, leased.id, leased.epoch, TerminationReason.COMPLETED, world.runs
        )
        assert (await world.reaper.tick()).taken_back == []
    world.clock.set(sandbox.shutdown_at)
    assert [s.id for s in (await world.reaper.tick()).taken_back] == [sandbox.id]


async def test_a_claim_the_api_refuses_to_delete_stays_with_its_row(world: World) -> None:
    """The row stays DELETING until a later pass deletes its claim, then the row goes."""
    sandbox = await ready_sandbox(world)
    world.cluster.refuse_delete(sandbox.claim_name)
    world.clock.advance(timedelta(minutes=1))
    reap = await world.reaper.tick()
    assert reap.refused == [sandbox.claim_name]
    assert await state_of(world, sandbox) is SandboxState.DELETING
    assert world.cluster.names() == {sandbox.claim_name}
    world.cluster.allow_delete(sandbox.claim_name)
    reap = await world.reaper.tick()
    assert reap.deleted == [sandbox.claim_name]
    assert await state_of(world, sandbox) is None
    assert world.cluster.names() == set()


async def test_labelled_claims_no_row_names_are_deleted_and_foreign_claims_stay(
    world: World,
) -> None:
    """The orphan sweep: our label and no row means delete; no label means not ours."""
    sandbox = await ready_sandbox(world)
    world.cluster.add_foreign("sbx-orphan", {SANDBOX_ID_LABEL: "purged"})
    world.cluster.add_foreign("gate-1")
    world.cluster.add_foreign("gate-2", {"team": "isolation"})
    reap = await world.reaper.tick()
    assert reap.orphans_deleted == ["sbx-orphan"]
    assert world.cluster.names() == {sandbox.claim_name, "gate-1", "gate-2"}


async def test_a_reaper_racing_a_next_call_never_leaves_a_run_leased_to_a_dead_sandbox(
    world: World,
) -> None:
    """Whichever wins, either the run is leased by a live sandbox, or the sandbox is taken back
    with the run still queued: the next call holds the row while it leases."""
    for order in ("reaper-first", "next-first", "together"):
        # Its first call comes just as the start limit passes.
        sandbox = await world.sandboxes.ensure("coder", workspace="ws", subject=order)
        token = await world.token_of(sandbox)
        world.clock.advance(timedelta(minutes=2))
        run = await world.runs.enqueue("code", workspace="ws", subject=order)

        async def next_call(token: str = token) -> object:
            try:
                return await world.sandboxes.next_run(token, world.runs)
            except SandboxNotLive as exc:
                return exc

        if order == "reaper-first":
            await world.reaper.tick()
            assert isinstance(await next_call(), SandboxNotLive)
        elif order == "next-first":
            await next_call()
            assert (await world.reaper.tick()).taken_back == []
        else:
            await asyncio.gather(world.reaper.tick(), next_call())
        state = await state_of(world, sandbox)
        current = await world.runs.get(run.id)
        if state in (SandboxState.REQUESTED, SandboxState.READY):
            assert current.state is AgentRunState.LEASED
        else:
            assert current.state is AgentRunState.QUEUED
        await world.runs.cancel(run.id)
        await world.sandboxes.take_back(sandbox.id)
        await world.reaper.tick()


async def test_the_reaper_leaves_a_sandbox_alone_while_a_call_holds_it(world: World) -> None:
    """A tick that starts while next holds the row does not take the sandbox back."""
    sandbox = await world.sandboxes.ensure("coder", workspace="ws", subject="task:1")
    token = await world.token_of(sandbox)
    world.clock.advance(timedelta(minutes=2))
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    async with world.stores.scope.transaction() as tx:
        held = await world.sandboxes.hold(tx, token)
        reaping = asyncio.create_task(world.reaper.tick())
        await asyncio.sleep(0)
        leased = await world.runs.claim_subject(
            f"sandbox:{held.id}", "ws", "task:1", kinds=["code"], tx=tx
        )
        assert leased is not None
        await world.store.touch(tx, held.id)
    reap = await reaping
    assert reap.taken_back == []
    assert await state_of(world, sandbox) is SandboxState.READY
    assert (await world.runs.get(run.id)).state is AgentRunState.LEASED


async def test_the_reaper_runs_until_stopped(world: World) -> None:
    """run() ticks at once, then waits for its interval or the stop, whichever comes first."""
    world.cluster.add_foreign("sbx-orphan", {SANDBOX_ID_LABEL: "purged"})
    stop = asyncio.Event()
    running = asyncio.create_task(world.reaper.run(stop, every=3600))
    for _ in range(500):
        if "sbx-orphan" not in world.cluster.names():
            break
        await asyncio.sleep(0.01)
    stop.set()
    await running
    assert world.cluster.names() == set()
