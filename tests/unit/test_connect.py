"""``agentruns.connect`` over a family the caller gives: the memory stores, no database."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

import agentruns
from agentruns.testing import ManualClock, MemoryFamily


async def _note(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    yield agentruns.StepEvent("noted", {"text": run.payload["text"]})


NOTE = agentruns.RunKind(agentruns.RunKindPolicy(name="note"), _note)


async def test_a_client_over_the_memory_family_runs_a_kind_to_completion() -> None:
    clock = ManualClock(datetime(2026, 5, 1, tzinfo=UTC))
    async with agentruns.connect(family=MemoryFamily(clock), kinds=[NOTE], clock=clock) as client:
        run = await client.runs.enqueue(
            "note", workspace="acme", subject="s", payload={"text": "hi"}
        )
        assert run.enqueued_at == clock.now()
        assert await client.worker(holder="w").claim_and_drive(limit=4) == 1
        done = await client.runs.get(run.id)
        assert done.end_reason is agentruns.TerminationReason.COMPLETED
        [event] = await client.runs.events(run.id)
        assert (event.type, event.data) == ("noted", {"text": "hi"})
        assert client.url is None
        assert client.clock is clock


async def test_awaiting_connect_gives_a_client_that_closes_once() -> None:
    client = await agentruns.connect(family=MemoryFamily(ManualClock()), kinds=[NOTE])
    assert client.kinds.names() == ["note"]
    assert client.runs is client.runs
    await client.close()
    await client.close()


async def test_the_randomness_given_is_the_randomness_backoff_draws_from() -> None:
    async def fails(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
        raise agentruns.ProviderError("overloaded", status=503)
        yield agentruns.StepEvent("never")

    policy = agentruns.RunKindPolicy(name="flaky", backoff=agentruns.Backoff(jitter=0.5))
    due = []
    for _ in range(2):
        clock = ManualClock(datetime(2026, 5, 1, tzinfo=UTC))
        async with agentruns.connect(
            family=MemoryFamily(clock),
            kinds=[agentruns.RunKind(policy, fails)],
            clock=clock,
            rng=random.Random(42),
        ) as client:
            run = await client.runs.enqueue("flaky", workspace="acme", subject="s")
            await client.worker(holder="w").claim_and_drive(limit=1)
            due.append((await client.runs.get(run.id)).due_at)
    assert due[0] == due[1] > datetime(2026, 5, 1, tzinfo=UTC)


async def test_a_worker_limited_to_an_unknown_kind_is_refused() -> None:
    async with agentruns.connect(family=MemoryFamily(ManualClock()), kinds=[NOTE]) as client:
        with pytest.raises(agentruns.UnknownKind):
            client.worker(kinds=["nope"])


async def test_a_url_and_a_family_together_are_refused() -> None:
    with pytest.raises(ValueError, match="a URL or a family"):
        await agentruns.connect("postgresql://db/x", family=MemoryFamily(ManualClock()))


async def test_sandboxes_without_a_hosting_are_refused_clearly() -> None:
    async with agentruns.connect(family=MemoryFamily(ManualClock())) as client:
        with pytest.raises(agentruns.StoreUnavailable, match="sandboxes="):
            _ = client.sandboxes
