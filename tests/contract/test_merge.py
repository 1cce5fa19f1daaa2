"""The ``merge`` policy and its debounce on every backend (ADRs/0031): new work joins the
subject's newest run if it was never claimed, and the kind reads every input."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.runs import AgentRuns
from agentruns.domain.errors import InvalidPayload, InvalidRequest
from agentruns.domain.limits import MAX_JSON_BYTES
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.subject_policy import MERGED, OnActive
from agentruns.domain.termination import TerminationReason
from examples.review import ReviewStatus
from tests.contract.conftest import START, Backend
from tests.contract.kinds import policy, scripted_steps

ENDED = AgentRunState.ENDED


async def _subject(runs: AgentRuns, subject: str = "c:1") -> list[AgentRun]:
    page = await runs.list_runs(workspace="acme", subject=subject, limit=100)
    return sorted(page.runs, key=lambda run: run.seq)


async def _merge(runs: AgentRuns, message: str, **options: object) -> tuple[AgentRun, bool]:
    done = await runs.enqueue_once(
        "chat",
        workspace="acme",
        subject="c:1",
        key=None,
        payload={"m": message},
        on_active="merge",
        **options,  # type: ignore[arg-type]
    )
    return done.run, done.created


async def test_merges_join_the_queued_run_and_the_kind_reads_every_input(
    runs: AgentRuns,
) -> None:
    first, created = await _merge(runs, "hi")
    second, second_created = await _merge(runs, "are you there?")
    third = await runs.enqueue(
        "chat", workspace="acme", subject="c:1", payload={"m": "hello?"}, on_active="merge"
    )
    assert created
    assert not second_created
    assert second.id == third.id == first.id
    assert [run.id for run in await _subject(runs)] == [first.id]
    assert await runs.inputs(first.id) == [{"m": "hi"}, {"m": "are you there?"}, {"m": "hello?"}]
    [claimed] = await runs.claim("w")
    assert claimed.id == first.id
    assert claimed.payload == {"m": "hi"}  # a kind that ignores merging reads what it did


async def test_a_claimed_run_is_not_joined_the_work_queues_behind_it(runs: AgentRuns) -> None:
    first, _ = await _merge(runs, "one")
    [leased] = await runs.claim("w")
    second, created = await _merge(runs, "two")
    third, third_created = await _merge(runs, "three")
    assert created
    assert not third_created
    assert leased.id == first.id
    assert second.id == third.id != first.id
    assert await runs.inputs(first.id) == [{"m": "one"}]
    assert await runs.inputs(second.id) == [{"m": "two"}, {"m": "three"}]


async def test_a_requeued_run_is_not_joined(runs: AgentRuns) -> None:
    """Claimed once (epoch 1), given back to the queue: its kind has read its inputs."""
    first, _ = await _merge(runs, "one")
    [leased] = await runs.claim("w")
    await runs.requeue(leased.fence, charged=False)
    second, created = await _merge(runs, "two")
    assert created
    assert second.id != first.id
    assert (await runs.get(first.id)).state is AgentRunState.QUEUED


async def test_merge_joins_only_the_newest_active_run_and_only_of_its_kind(
    runs: AgentRuns, kinds: RunKinds
) -> None:
    kinds.register(RunKind(policy("other"), scripted_steps))
    older = await runs.enqueue("chat", workspace="acme", subject="c:1")
    other = await runs.enqueue("other", workspace="acme", subject="c:1")
    merged, created = await _merge(runs, "x")
    assert created  # the newest run is of another kind
    again, again_created = await _merge(runs, "y")
    assert not again_created
    assert again.id == merged.id
    assert [run.id for run in await _subject(runs)] == [older.id, other.id, merged.id]
    assert await runs.inputs(older.id) == [{}]


async def test_an_ended_run_is_not_joined(runs: AgentRuns) -> None:
    first, _ = await _merge(runs, "one")
    await runs.cancel(first.id)
    second, created = await _merge(runs, "two")
    assert created
    assert second.id != first.id
    assert (await runs.get(first.id)).end_reason is TerminationReason.CANCELLED


async def test_a_merge_too_large_together_is_refused_and_writes_nothing(runs: AgentRuns) -> None:
    half = "x" * (MAX_JSON_BYTES // 2)
    first, _ = await _merge(runs, half)
    with pytest.raises(InvalidPayload, match=f"merging into run {first.id}"):
        await _merge(runs, half)
    assert await runs.inputs(first.id) == [{"m": half}]
    assert [run.id for run in await _subject(runs)] == [first.id]


async def test_bad_merge_requests_are_refused_before_anything_is_written(
    runs: AgentRuns,
) -> None:
    with pytest.raises(InvalidRequest, match="a debounce is a merge's"):
        await runs.enqueue("chat", workspace="acme", subject="c:1", debounce=timedelta(seconds=5))
    with pytest.raises(InvalidRequest, match="enqueue key and on_active merge"):
        await runs.enqueue("chat", workspace="acme", subject="c:1", key="k", on_active="merge")
    with pytest.raises(InvalidRequest, match="debounce must be longer than zero"):
        await _merge(runs, "x", debounce=timedelta(0))
    with pytest.raises(InvalidRequest, match="enqueue_once needs a key"):
        await runs.enqueue_once("chat", workspace="acme", subject="c:1", key=None)
    with pytest.raises(InvalidRequest, match="agentruns' own"):
        await runs.signal(
            (await runs.enqueue("chat", workspace="acme", subject="c:2")).id, MERGED, {}
        )
    assert await _subject(runs) == []


async def test_debounce_holds_the_run_until_the_messages_stop(
    runs: AgentRuns, backend: Backend
) -> None:
    window = timedelta(seconds=10)
    first, _ = await _merge(runs, "one", debounce=window)
    assert first.due_at == START + window
    assert await runs.claim("w") == []
    backend.clock.advance(timedelta(seconds=8))
    joined, created = await _merge(runs, "two", debounce=window)
    assert not created
    assert joined.due_at == START + timedelta(seconds=18)
    backend.clock.advance(timedelta(seconds=8))  # 16 s: due at 18 s
    assert await runs.claim("w") == []
    backend.clock.advance(timedelta(seconds=2))
    [claimed] = await runs.claim("w")
    assert claimed.id == first.id
    assert await runs.inputs(first.id) == [{"m": "one"}, {"m": "two"}]


async def test_the_kind_s_max_wait_bounds_a_stream_of_merges(
    runs: AgentRuns, kinds: RunKinds, backend: Backend
) -> None:
    kinds.register(
        RunKind(
            policy(
                "chatty",
                on_active=OnActive.MERGE,
                debounce=timedelta(seconds=10),
                debounce_max_wait=timedelta(seconds=25),
            ),
            scripted_steps,
        )
    )
    made = await runs.enqueue("chatty", workspace="acme", subject="s")
    for _ in range(5):  # a message every 8 s would hold it back for ever
        backend.clock.advance(timedelta(seconds=8))
        joined = await runs.enqueue("chatty", workspace="acme", subject="s")
        assert joined.id == made.id
        assert joined.due_at <= START + timedelta(seconds=25)
        if backend.clock.now() >= START + timedelta(seconds=25):
            break
    [claimed] = await runs.claim("w")
    assert claimed.id == made.id
    assert claimed.due_at == START + timedelta(seconds=25)


async def test_a_merge_never_hurries_a_run_due_later(runs: AgentRuns) -> None:
    later = START + timedelta(hours=1)
    first = await runs.enqueue(
        "chat", workspace="acme", subject="c:1", due_at=later, on_active="merge"
    )
    joined, created = await _merge(runs, "x", debounce=timedelta(seconds=5))
    assert not created
    assert first.due_at == joined.due_at == later


async def test_merges_racing_make_one_run_with_every_input(runs: AgentRuns) -> None:
    done = await asyncio.gather(*(_merge(runs, str(index)) for index in range(8)))
    assert len({run.id for run, _ in done}) == 1
    assert sum(created for _, created in done) == 1
    [run] = await _subject(runs)
    inputs = await runs.inputs(run.id)
    assert sorted(str(entry["m"]) for entry in inputs) == [str(index) for index in range(8)]


async def test_a_merge_racing_the_claim_never_loses_its_message(runs: AgentRuns) -> None:
    """The claim takes the run first (the work is a new run), or the merge joins first (the
    claim's run has the message among its inputs), or the claim skipped the run the merge held
    locked (one queued run with both); either way one leased run at most."""
    for round_ in range(10):
        subject = f"race:{round_}"
        await runs.enqueue(
            "chat", workspace="acme", subject=subject, payload={"m": "a"}, on_active="merge"
        )
        merged, claimed = await asyncio.gather(
            runs.enqueue(
                "chat", workspace="acme", subject=subject, payload={"m": "b"}, on_active="merge"
            ),
            runs.claim_subject("w", "acme", subject, kinds=["chat"]),
        )
        everything = [
            entry for run in await _subject(runs, subject) for entry in await runs.inputs(run.id)
        ]
        assert sorted(str(entry["m"]) for entry in everything) == ["a", "b"]
        alive = [run for run in await _subject(runs, subject) if run.state is not ENDED]
        assert sum(run.state is AgentRunState.LEASED for run in alive) <= 1
        if claimed is None or merged.id == claimed.id:
            assert await runs.inputs(merged.id) == [{"m": "a"}, {"m": "b"}]
        else:
            assert (await runs.get(merged.id)).state is AgentRunState.QUEUED
            assert await runs.inputs(claimed.id) == [{"m": "a"}]


async def test_a_merge_in_the_caller_s_transaction_rolls_back_with_it(runs: AgentRuns) -> None:
    first, _ = await _merge(runs, "a")

    async def merge_then_fail() -> None:
        async with runs.transaction() as tx:
            await runs.enqueue(
                "chat",
                workspace="acme",
                subject="c:1",
                payload={"m": "b"},
                on_active="merge",
                debounce=timedelta(minutes=5),
                tx=tx,
            )
            raise RuntimeError("the host's own write failed")

    with pytest.raises(RuntimeError):
        await merge_then_fail()
    assert await runs.inputs(first.id) == [{"m": "a"}]
    assert (await runs.get(first.id)).due_at == first.due_at


async def test_a_merge_leaves_the_joined_run_s_domain_row_as_it_was(
    runs: AgentRuns, backend: Backend
) -> None:
    """The kind's row moves with its run's state; a join moves no state, so the row is the
    queued run's, one row for the one run."""
    first = await runs.enqueue("review", workspace="acme", subject="review:1", on_active="merge")
    joined = await runs.enqueue(
        "review", workspace="acme", subject="review:1", payload={"n": 2}, on_active="merge"
    )
    assert joined.id == first.id
    async with backend.stores.scope.transaction() as tx:
        job = await backend.review_jobs.get(tx, first.id)
    assert job is not None
    assert job.status is ReviewStatus.QUEUED
    [claimed] = await runs.claim("w")
    assert claimed.id == first.id
