"""Group claims on every backend: concurrent claims of one worker made as one claim."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence

from agentruns.app.claimer import GroupClaimer
from agentruns.app.kinds import RunKinds
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.errors import StoreUnavailable
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome
from tests.contract.conftest import Backend


def counted(runs: AgentRuns) -> list[int]:
    """Record the limit of every claim the store is asked for."""
    limits: list[int] = []
    claim = runs.claim

    async def counting(
        holder: str, *, limit: int = 1, kinds: Sequence[str] | None = None
    ) -> list[AgentRun]:
        limits.append(limit)
        return await claim(holder, limit=limit, kinds=kinds)

    runs.claim = counting  # type: ignore[method-assign]
    return limits


async def test_concurrent_single_claims_of_one_worker_are_one_claim(
    backend: Backend, runs: AgentRuns, kinds: RunKinds
) -> None:
    """Four tasks each drive one run at a time on one worker: one claim of four, each task
    gets its own run, and every run completes."""
    for index in range(4):
        await runs.enqueue("chat", workspace="acme", subject=f"s-{index}", payload={"steps": 0})
    limits = counted(runs)
    worker = Worker(runs, kinds, backend.stores.notifier, random.Random(1), holder="w")
    assert await asyncio.gather(*(worker.claim_and_drive(1) for _ in range(4))) == [1] * 4
    assert limits == [4]
    assert worker.stats.outcomes == {RunOutcome.COMPLETED: 4}


async def test_a_lone_claim_is_made_at_once_and_an_empty_queue_answers_empty(
    backend: Backend, runs: AgentRuns, kinds: RunKinds
) -> None:
    limits = counted(runs)
    worker = Worker(runs, kinds, backend.stores.notifier, random.Random(1), holder="w")
    assert await worker.claim_and_drive(3) == 0
    await runs.enqueue("chat", workspace="acme", subject="s", payload={"steps": 0})
    assert await worker.claim_and_drive(3) == 1
    assert limits == [3, 3]


def gated(
    runs: AgentRuns, entered: asyncio.Event, gate: asyncio.Event
) -> Callable[[int], Awaitable[list[AgentRun]]]:
    async def claim(limit: int) -> list[AgentRun]:
        entered.set()
        await gate.wait()
        return await runs.claim("w", limit=limit)

    return claim


async def test_a_run_dealt_to_a_cancelled_request_goes_to_the_next_one(runs: AgentRuns) -> None:
    """A request cancelled while its claim was in flight leaves its run to the next request,
    leased, not lost."""
    for index in range(2):
        await runs.enqueue("chat", workspace="acme", subject=f"s-{index}")
    entered, gate = asyncio.Event(), asyncio.Event()
    claimer = GroupClaimer(gated(runs, entered, gate))
    first = asyncio.create_task(claimer.claim(1))
    second = asyncio.create_task(claimer.claim(1))
    await entered.wait()  # both requests wait on one claim of two, in flight
    first.cancel()
    gate.set()
    [got] = await second
    assert got.state is AgentRunState.LEASED
    [kept] = await claimer.claim(5)  # the cancelled request's run, without a claim
    assert kept.id != got.id
    assert kept.state is AgentRunState.LEASED
    assert (await runs.get(kept.id)).holder == "w"


async def test_a_failed_group_claim_fails_each_request_of_the_group(runs: AgentRuns) -> None:
    async def failing(limit: int) -> list[AgentRun]:
        await asyncio.sleep(0)
        raise StoreUnavailable("the database went away")

    claimer = GroupClaimer(failing)
    answers = await asyncio.gather(claimer.claim(1), claimer.claim(2), return_exceptions=True)
    assert [type(answer) for answer in answers] == [StoreUnavailable, StoreUnavailable]
    healthy = GroupClaimer(lambda limit: runs.claim("w", limit=limit))
    assert await healthy.claim(1) == []
