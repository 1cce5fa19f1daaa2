"""Subject policies under real concurrency (ADRs/0028): two processes' pools racing enqueues,
claims and ends on one subject leave one of the policy's outcomes, never two active runs and
never a lost message."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime, timedelta
from typing import TypeVar
from uuid import UUID

import psycopg
import pytest

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.postgres import PostgresFamily
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.runs import AgentRuns
from agentruns.domain.errors import LeaseLost, SubjectBusy
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import TerminationReason
from tests.contract.kinds import policy, scripted_steps
from tests.postgres.test_lanes import assert_lanes_true

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SUBJECTS = 200
WAVE = 25
T = TypeVar("T")


@pytest.fixture
async def two_sides(postgres_url: str) -> AsyncIterator[tuple[AgentRuns, AgentRuns]]:
    """Two AgentRuns as two processes would hold them: each its own pool, on one database."""
    clock = ManualClock(START)
    families = [PostgresFamily(postgres_url, clock, pool_size=8) for _ in range(2)]
    kinds = RunKinds([RunKind(policy("chat"), scripted_steps)])
    try:
        left, right = (AgentRuns(f.stores, kinds, random.Random(n)) for n, f in enumerate(families))
        yield left, right
    finally:
        for family in families:
            await family.close()


async def _active(url: str) -> dict[str, list[UUID]]:
    """Each subject's runs that have not ended."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cursor = await conn.execute(
            "SELECT subject, id FROM agent_run WHERE state <> 'ended' ORDER BY subject, seq"
        )
        rows = await cursor.fetchall()
    found: dict[str, list[UUID]] = {}
    for subject, run_id in rows:
        found.setdefault(subject, []).append(run_id)
    return found


async def _waves(calls: list[Awaitable[T]]) -> list[T]:
    done: list[T] = []
    for start in range(0, len(calls), WAVE):
        done += await asyncio.gather(*calls[start : start + WAVE])
    return done


def _enqueue(runs: AgentRuns, subject: str, on_active: str) -> Awaitable[AgentRun]:
    return runs.enqueue("chat", workspace="acme", subject=subject, on_active=on_active)


async def _claim(runs: AgentRuns, subject: str) -> AgentRun | None:
    return await runs.claim_subject("race", "acme", subject, kinds=["chat"])


async def test_two_interrupts_racing_a_leased_run_leave_one_active_run(
    two_sides: tuple[AgentRuns, AgentRuns], postgres_url: str
) -> None:
    """Each subject's leased run, interrupted from both sides at once while a claimer takes
    what is queued: the leased run ends cancelled, one of the two new runs is the subject's
    only active run, and the other ended cancelled by it (both messages were enqueued)."""
    left, right = two_sides
    subjects = [f"s:{n}" for n in range(SUBJECTS)]
    leased = {}
    for subject in subjects:
        await _enqueue(left, subject, "queue")
        run = await _claim(left, subject)
        assert run is not None
        leased[subject] = run.id

    async def race(subject: str) -> tuple[AgentRun, AgentRun, AgentRun | None]:
        one, two, claimed = await asyncio.gather(
            _enqueue(left, subject, "interrupt"),
            _enqueue(right, subject, "interrupt"),
            _claim(right, subject),
        )
        return one, two, claimed

    raced = await _waves([race(subject) for subject in subjects])
    active = await _active(postgres_url)
    for subject, (one, two, _) in zip(subjects, raced, strict=True):
        [alive] = active[subject]
        assert alive in {one.id, two.id}
        loser = (await left.get(one.id if alive == two.id else two.id)).end_reason
        assert loser is TerminationReason.CANCELLED
        assert (await left.get(leased[subject])).end_reason is TerminationReason.CANCELLED
    assert set(active) == set(subjects)


async def test_two_rejects_racing_an_idle_subject_make_one_run(
    two_sides: tuple[AgentRuns, AgentRuns], postgres_url: str
) -> None:
    """Of two rejects racing an idle subject, one makes the run and the other names it."""
    left, right = two_sides
    subjects = [f"r:{n}" for n in range(SUBJECTS)]

    async def race(subject: str) -> tuple[AgentRun | BaseException, AgentRun | BaseException]:
        return await asyncio.gather(
            _enqueue(left, subject, "reject"),
            _enqueue(right, subject, "reject"),
            return_exceptions=True,
        )

    raced = await _waves([race(subject) for subject in subjects])
    active = await _active(postgres_url)
    for subject, outcomes in zip(subjects, raced, strict=True):
        made = [outcome for outcome in outcomes if isinstance(outcome, AgentRun)]
        refused = [outcome for outcome in outcomes if isinstance(outcome, SubjectBusy)]
        assert len(made) == 1, outcomes
        assert len(refused) == 1, outcomes
        assert refused[0].run_id == made[0].id
        assert active[subject] == [made[0].id]


async def test_an_interrupt_racing_the_holder_s_end_and_a_claim_leaves_one_outcome(
    two_sides: tuple[AgentRuns, AgentRuns], postgres_url: str
) -> None:
    """The holder completes its run while an interrupt arrives and a claimer polls: the old run
    ends once (completed or cancelled, whichever committed first), the new run is the subject's
    one active run, leased or queued."""
    left, right = two_sides
    subjects = [f"e:{n}" for n in range(SUBJECTS)]
    fences = {}
    for subject in subjects:
        await _enqueue(left, subject, "queue")
        run = await _claim(left, subject)
        assert run is not None
        fences[subject] = run.fence

    async def holder_end(subject: str) -> str:
        try:
            await left.end(fences[subject], TerminationReason.COMPLETED)
        except LeaseLost:
            return "lost"
        return "ended"

    async def race(subject: str) -> tuple[str, AgentRun, AgentRun | None]:
        ended, new, claimed = await asyncio.gather(
            holder_end(subject), _enqueue(right, subject, "interrupt"), _claim(left, subject)
        )
        return ended, new, claimed

    raced = await _waves([race(subject) for subject in subjects])
    active = await _active(postgres_url)
    for subject, (ended, new, claimed) in zip(subjects, raced, strict=True):
        assert active[subject] == [new.id]
        old = await left.get(fences[subject].run_id)
        expected = TerminationReason.COMPLETED if ended == "ended" else TerminationReason.CANCELLED
        assert old.end_reason is expected
        assert claimed is None or claimed.id == new.id


def _say(runs: AgentRuns, subject: str, message: str) -> Awaitable[AgentRun]:
    return runs.enqueue(
        "chat", workspace="acme", subject=subject, payload={"m": message}, on_active="merge"
    )


async def _messages(runs: AgentRuns, run_ids: list[UUID]) -> list[str]:
    found = [entry for run_id in run_ids for entry in await runs.inputs(run_id)]
    return sorted(str(entry["m"]) for entry in found)


async def test_two_merges_racing_the_claim_of_the_queued_run_lose_no_message(
    two_sides: tuple[AgentRuns, AgentRuns], postgres_url: str
) -> None:
    """Each subject has a queued run never claimed; two merges from two sides race a claimer.
    Every message is an input of exactly one run; at most one run is leased; a claimed run's
    inputs are those its kind read right after the claim; a merge either
    joined the run (before the claim, or while the claim skipped it) or made the one run
    behind the claimed one, which the other merge joined or was joined by."""
    left, right = two_sides
    subjects = [f"m:{n}" for n in range(SUBJECTS)]
    for subject in subjects:
        await _say(left, subject, "a")

    async def claim_and_read(subject: str) -> tuple[AgentRun | None, list[str]]:
        """The claim, and the inputs its kind would read right after it."""
        claimed = await _claim(right, subject)
        return claimed, [] if claimed is None else await _messages(right, [claimed.id])

    async def race(subject: str) -> tuple[AgentRun, AgentRun, AgentRun | None, list[str]]:
        one, two, (claimed, read) = await asyncio.gather(
            _say(left, subject, "b"), _say(right, subject, "c"), claim_and_read(subject)
        )
        return one, two, claimed, read

    raced = await _waves([race(subject) for subject in subjects])
    active = await _active(postgres_url)
    for subject, (one, two, claimed, read) in zip(subjects, raced, strict=True):
        alive = active[subject]
        assert await _messages(left, alive) == ["a", "b", "c"], subject
        assert 1 <= len(alive) <= 2
        leased = [run_id for run_id in alive if (await left.get(run_id)).state.value == "leased"]
        assert len(leased) <= 1
        assert claimed is None or claimed.id == alive[0]
        if claimed is not None:  # no merge joined the run once it was claimed
            assert await _messages(left, [claimed.id]) == read, subject
        if len(alive) == 2:  # the claim came first; both late merges share the run behind it
            assert claimed is not None
            assert {one.id, two.id} <= set(alive)


async def test_a_claim_skips_the_run_a_merge_holds_and_then_sees_its_input(
    two_sides: tuple[AgentRuns, AgentRuns],
) -> None:
    """A merge still in its transaction holds the run it joins: a claim from another process
    meanwhile takes nothing, and after the commit it takes the run with both inputs (were the
    run not held, the claim would take it and the merge's input would come after the claim)."""
    left, right = two_sides
    first = await _say(left, "held", "a")
    async with left.transaction() as tx:
        joined = await left.enqueue(
            "chat", workspace="acme", subject="held", payload={"m": "b"}, on_active="merge", tx=tx
        )
        assert joined.id == first.id
        assert await _claim(right, "held") is None
    claimed = await _claim(right, "held")
    assert claimed is not None
    assert claimed.id == first.id
    assert await _messages(right, [first.id]) == ["a", "b"]


async def test_the_lanes_follow_a_debounced_run_s_due_time(
    two_sides: tuple[AgentRuns, AgentRuns], postgres_url: str
) -> None:
    """Debounced merges from both sides move heads' due times: after them the workspace's lane
    names the same first due head as the runs do (the claim reads lanes, ADRs/0017)."""
    left, right = two_sides
    window = timedelta(minutes=10)

    def say(runs: AgentRuns, subject: str, message: str) -> Awaitable[AgentRun]:
        return runs.enqueue(
            "chat", workspace="acme", subject=subject, payload={"m": message},
            on_active="merge", debounce=window,
        )  # fmt: skip

    subjects = [f"d:{n}" for n in range(40)]
    await _waves([say(left, subject, "a") for subject in subjects])
    await _claim(left, subjects[0])  # a fold; nothing is due yet
    await _waves([say(side, subject, "b") for subject in subjects for side in (left, right)])
    assert_lanes_true(postgres_url)
    for subject in subjects:
        [alive] = (await _active(postgres_url))[subject]
        assert await _messages(left, [alive]) == ["a", "b", "b"]
