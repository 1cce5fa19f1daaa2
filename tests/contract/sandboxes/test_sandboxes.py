"""AgentSandboxes: one live sandbox per subject, its row before its claim, and its calls."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agentruns.adapters.tokens import JwtSandboxTokens, SigningKey
from agentruns.app.sandbox_ports import SandboxClaimRef, SandboxClaims, SandboxClaimSpec
from agentruns.app.sandboxes import AgentSandboxes, claim_name_of
from agentruns.domain.errors import (
    IllegalTransition,
    InvalidRequest,
    InvalidToken,
    SandboxError,
    SandboxNotLive,
    StaleEpoch,
)
from agentruns.domain.sandbox import AgentSandbox, LeaseRefusal, SandboxLeaseRefused, SandboxState
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from tests.contract.sandboxes.world import CODER, GATEWAY_URL, START, TALKER, World


async def ensure_coder(world: World, subject: str = "task:1") -> AgentSandbox:
    return await world.sandboxes.ensure("coder", workspace="ws", subject=subject)


async def test_ensure_writes_a_requested_row_and_a_claim_that_carries_a_token(
    world: World,
) -> None:
    """The row is REQUESTED and the claim names the kind's pool, the shutdown and the token."""
    sandbox = await ensure_coder(world)
    assert sandbox.state is SandboxState.REQUESTED
    assert sandbox.requested_at == START
    assert sandbox.shutdown_at == START + CODER.lifetime
    assert await world.row(sandbox.id) == sandbox
    body = world.cluster.body(claim_name_of(sandbox.id))
    assert body is not None
    assert body["spec"]["warmPoolRef"] == {"name": "coder-pool"}
    assert body["spec"]["lifecycle"]["shutdownTime"] == "2026-03-01T13:00:00Z"
    env = {item["name"]: item["value"] for item in body["spec"]["env"]}
    assert env["AGENTRUNS_GATEWAY_URL"] == GATEWAY_URL
    identity = world.tokens.verify(env["AGENTRUNS_SANDBOX_TOKEN"])
    assert (identity.sandbox_id, identity.workspace, identity.subject) == (
        sandbox.id,
        "ws",
        "task:1",
    )
    assert identity.expires_at == sandbox.shutdown_at


async def test_a_subject_has_at_most_one_live_sandbox(world: World) -> None:
    """A second ensure for the subject returns the live sandbox and creates no claim."""
    first = await ensure_coder(world)
    again = await world.sandboxes.ensure("talker", workspace="ws", subject="task:1")
    assert again == first
    assert world.cluster.names() == {first.claim_name}
    other = await ensure_coder(world, "task:2")
    assert other.id != first.id


async def test_the_row_is_committed_before_the_claim_is_created(world: World) -> None:
    """When the cluster is asked for the claim, another transaction already sees the row."""
    seen: list[AgentSandbox | None] = []

    class Watching(SandboxClaims):
        async def create(self, spec: SandboxClaimSpec) -> None:
            async with world.stores.scope.transaction() as tx:
                seen.append(await world.store.get(tx, spec.sandbox_id))
            await world.cluster.claims.create(spec)

        async def delete(self, name: str) -> None:
            await world.cluster.claims.delete(name)

        async def list_labelled(self) -> list[SandboxClaimRef]:
            return await world.cluster.claims.list_labelled()

    sandboxes = AgentSandboxes(
        world.stores.scope,
        world.store,
        Watching(),
        world.tokens,
        [CODER],
        gateway_url=GATEWAY_URL,
    )
    sandbox = await sandboxes.ensure("coder", workspace="ws", subject="task:1")
    assert seen == [sandbox]


async def test_a_claim_the_cluster_refuses_takes_the_new_row_back(world: World) -> None:
    """The row is DELETING at once (its token never works) and a later ensure starts afresh."""
    world.cluster.add_foreign(claim_name_of(world.ids[0]))
    with pytest.raises(SandboxError):
        await ensure_coder(world)
    refused = await world.row(world.ids[0])
    assert refused is not None
    assert refused.state is SandboxState.DELETING
    fresh = await ensure_coder(world)
    assert fresh.id == world.ids[1]
    assert fresh.state is SandboxState.REQUESTED


async def test_ensure_refuses_an_unknown_kind_before_writing(world: World) -> None:
    """An unknown sandbox kind writes no row and no claim."""
    with pytest.raises(InvalidRequest):
        await world.sandboxes.ensure("nope", workspace="ws", subject="task:1")
    assert world.cluster.names() == set()


async def test_the_first_call_marks_the_sandbox_ready(world: World) -> None:
    """READY at its first call; later calls keep ready_at, and lease nothing."""
    sandbox = await ensure_coder(world)
    token = await world.token_of(sandbox)
    world.clock.advance(timedelta(seconds=20))
    ready = await world.sandboxes.call(token)
    assert ready.state is SandboxState.READY
    assert ready.ready_at == START + timedelta(seconds=20)
    world.clock.advance(timedelta(seconds=20))
    again = await world.sandboxes.call(token)
    assert again.ready_at == START + timedelta(seconds=20)
    assert again.last_used_at is None


async def test_next_leases_the_subjects_run_of_a_driven_kind_and_moves_last_used(
    world: World,
) -> None:
    """Only the sandbox's subject, only the kinds its kind drives, and last_used_at moves."""
    sandbox = await ensure_coder(world)
    token = await world.token_of(sandbox)
    chat = await world.runs.enqueue("chat", workspace="ws", subject="task:1")
    assert await world.sandboxes.next_run(token, world.runs) is None
    await world.runs.cancel(chat.id)
    await world.runs.enqueue("code", workspace="ws", subject="task:2")
    assert await world.sandboxes.next_run(token, world.runs) is None
    code = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    world.clock.advance(timedelta(seconds=5))
    leased = await world.sandboxes.next_run(token, world.runs)
    assert leased is not None
    assert leased.id == code.id
    assert leased.state is AgentRunState.LEASED
    assert leased.holder == f"sandbox:{sandbox.id}"
    row = await world.row(sandbox.id)
    assert row is not None
    assert row.last_used_at == START + timedelta(seconds=5)


async def test_a_sandbox_kind_that_drives_nothing_leases_nothing(world: World) -> None:
    """Review jobs belong to the worker's executor: a reviewer sandbox's next is empty."""
    sandbox = await world.sandboxes.ensure("reviewer", workspace="ws", subject="review:1")
    await world.runs.enqueue("review", workspace="ws", subject="review:1")
    assert await world.sandboxes.next_run(await world.token_of(sandbox), world.runs) is None
    row = await world.row(sandbox.id)
    assert row is not None
    assert row.state is SandboxState.READY
    assert row.last_used_at is None


async def test_renew_and_end_are_fenced_to_the_sandbox_that_holds_the_run(world: World) -> None:
    """A stale epoch or another holder's run is a lost lease; the current fence settles."""
    sandbox = await ensure_coder(world)
    token = await world.token_of(sandbox)
    other = await ensure_coder(world, "task:2")
    other_token = await world.token_of(other)
    await world.runs.enqueue("code", workspace="ws", subject="task:1")
    run = await world.sandboxes.next_run(token, world.runs)
    assert run is not None
    world.clock.advance(timedelta(seconds=20))
    renewed = await world.sandboxes.renew(token, run.id, run.epoch, world.runs)
    assert renewed.leased_until == START + timedelta(seconds=50)
    with pytest.raises(SandboxLeaseRefused) as stale:
        await world.sandboxes.renew(token, run.id, run.epoch - 1, world.runs)
    assert stale.value.reason is LeaseRefusal.LEASE_LOST
    assert isinstance(stale.value.__cause__, StaleEpoch)
    with pytest.raises(SandboxLeaseRefused) as foreign:
        await world.sandboxes.end(
            other_token, run.id, run.epoch, TerminationReason.COMPLETED, world.runs
        )
    assert foreign.value.reason is LeaseRefusal.LEASE_LOST
    ended = await world.sandboxes.end(
        token, run.id, run.epoch, TerminationReason.COMPLETED, world.runs
    )
    assert ended.state is AgentRunState.ENDED


async def test_a_token_stops_the_moment_its_sandbox_is_taken_back(world: World) -> None:
    """The signature still holds, but the row is DELETING: refused, nothing leased."""
    sandbox = await ensure_coder(world)
    token = await world.token_of(sandbox)
    await world.sandboxes.call(token)
    queued = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    await world.sandboxes.take_back(sandbox.id)
    with pytest.raises(SandboxNotLive):
        await world.sandboxes.next_run(token, world.runs)
    assert (await world.runs.get(queued.id)).state is AgentRunState.QUEUED


async def test_a_token_past_its_sandbox_shutdown_is_refused(world: World) -> None:
    """At shutdown the token itself expires."""
    sandbox = await ensure_coder(world)
    token = await world.token_of(sandbox)
    world.clock.set(sandbox.shutdown_at)
    with pytest.raises(InvalidToken):
        await world.sandboxes.call(token)


async def test_a_token_of_a_deleted_sandbox_is_refused(world: World) -> None:
    """Once the reaper deleted the row, its token names nothing live."""
    sandbox = await ensure_coder(world)
    token = await world.token_of(sandbox)
    await world.sandboxes.take_back(sandbox.id)
    await world.reaper.tick()
    assert await world.row(sandbox.id) is None
    with pytest.raises(SandboxNotLive):
        await world.sandboxes.call(token)


async def test_a_conversation_kind_makes_conversation_sandboxes(world: World) -> None:
    """The kind's conversation flag is the row's."""
    sandbox = await world.sandboxes.ensure("talker", workspace="ws", subject="chat:1")
    assert sandbox.conversation is TALKER.conversation is True


async def test_only_a_deleting_row_is_deleted(world: World) -> None:
    """The store refuses to delete a live sandbox's row: its claim would be left ownerless."""
    sandbox = await ensure_coder(world)
    with pytest.raises(IllegalTransition):
        async with world.stores.scope.transaction() as tx:
            await world.store.delete(tx, sandbox.id)
    assert await world.row(sandbox.id) == sandbox


async def test_ensure_replaces_a_sandbox_past_its_shutdown(world: World) -> None:
    """A live row whose shutdown passed is no sandbox to hand out: it is taken back, and a new
    one is made in its place before the reaper comes by."""
    old = await ensure_coder(world)
    world.clock.set(old.shutdown_at)
    new = await ensure_coder(world)
    assert new.id != old.id
    assert new.shutdown_at == old.shutdown_at + CODER.lifetime
    gone = await world.row(old.id)
    assert gone is not None
    assert gone.state is SandboxState.DELETING
    await world.reaper.tick()
    assert world.cluster.names() == {new.claim_name}


async def test_concurrent_ensures_of_a_subject_make_one_sandbox(world: World) -> None:
    """Racing callers all get the one live sandbox, and the cluster gets one claim."""
    results = await asyncio.gather(*(ensure_coder(world) for _ in range(4)))
    assert len({sandbox.id for sandbox in results}) == 1
    assert world.cluster.names() == {results[0].claim_name}


async def test_two_workspaces_on_one_subject_string_have_two_sandboxes(world: World) -> None:
    """ensure for globex on acme's subject string creates globex's own sandbox."""
    acme = await world.sandboxes.ensure("coder", workspace="acme", subject="pull-request:42")
    globex = await world.sandboxes.ensure("coder", workspace="globex", subject="pull-request:42")
    assert globex.id != acme.id
    assert (globex.workspace, acme.workspace) == ("globex", "acme")
    assert world.cluster.names() == {acme.claim_name, globex.claim_name}


async def test_a_sandbox_never_shuts_down_before_its_request(world: World) -> None:
    """Shutdowns are whole seconds, capped by the signing key's end: when that rounds to a
    moment not after the request, ensure refuses and writes no row and no claim."""
    key = SigningKey("short", b"s" * 32, not_after=START + timedelta(seconds=10, milliseconds=700))
    sandboxes = AgentSandboxes(
        world.stores.scope,
        world.store,
        world.cluster.claims,
        JwtSandboxTokens([key], world.clock),
        [CODER],
        gateway_url=GATEWAY_URL,
        new_id=lambda: world.ids[0],
    )
    world.clock.advance(timedelta(seconds=10, milliseconds=300))
    with pytest.raises(SandboxError, match="signing key"):
        await sandboxes.ensure("coder", workspace="ws", subject="task:1")
    assert await world.row(world.ids[0]) is None
    assert world.cluster.names() == set()


async def test_the_last_use_stays_within_the_sandboxs_life(world: World) -> None:
    """A lease at or past the shutdown moves nothing: last_used_at never passes the shutdown,
    so it cannot keep a sandbox from idling beyond its life."""
    sandbox = await ensure_coder(world)
    await world.sandboxes.call(await world.token_of(sandbox))
    world.clock.advance(timedelta(minutes=10))
    async with world.stores.scope.transaction() as tx:
        used = await world.store.touch(tx, sandbox.id)
    assert used.last_used_at == START + timedelta(minutes=10)
    world.clock.set(sandbox.shutdown_at)
    with pytest.raises(SandboxNotLive):
        async with world.stores.scope.transaction() as tx:
            await world.store.touch(tx, sandbox.id)
    row = await world.row(sandbox.id)
    assert row is not None
    assert row.last_used_at == START + timedelta(minutes=10)


@pytest.mark.parametrize(
    ("workspace", "subject"),
    [
        ("ws", "task\x00:1"),
        ("ws\x00", "task:1"),
        ("ws", "task:\ud800"),
        ("ws", "x" * 513),
        ("ws", "  "),
    ],
    ids=["nul-subject", "nul-workspace", "lone-surrogate", "too-long", "blank"],
)
async def test_ensure_refuses_a_name_that_cannot_be_stored(
    world: World, workspace: str, subject: str
) -> None:
    """The same refusal on every store, before a row or a claim is written."""
    with pytest.raises(InvalidRequest):
        await world.sandboxes.ensure("coder", workspace=workspace, subject=subject)
    assert world.cluster.names() == set()
