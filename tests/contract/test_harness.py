"""The test kit's harness on both adapters (the pytest plugin's ``agentruns_harness``):
``drain()`` plays out what production would, moving the manual clock only to moments when the
worker or the reaper would act."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from agentruns import (
    AgentRun,
    AgentRunState,
    Backoff,
    BudgetHold,
    FailureClass,
    OnActive,
    ProviderError,
    RecordedSteps,
    RunKind,
    RunKindPolicy,
    RunOutcome,
    StepContext,
    StepEvent,
    SubjectBusy,
    TerminationReason,
)
from agentruns.testing import HarnessFactory

START = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
BACKOFF = Backoff(base=timedelta(seconds=30), jitter=0.0)


async def _answer(run: AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("answered", {"epoch": run.epoch})


def _flaky_once() -> RunKind:
    """Fails its first attempt with a 503 (requeued after 30 s), then answers."""
    failed: set[object] = set()

    async def steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        if run.id not in failed:
            failed.add(run.id)
            raise ProviderError("overloaded", status=503)
        yield StepEvent("answered", {"attempt": run.attempt})

    return RunKind(RunKindPolicy(name="flaky", backoff=BACKOFF), steps)


PLAIN = RunKind(RunKindPolicy(name="plain"), _answer)
SLOW_DEADLINE = RunKind(RunKindPolicy(name="timely", deadline=timedelta(minutes=10)), _answer)


async def test_a_run_behind_a_head_that_backs_off_runs_once_the_head_is_done(
    agentruns_harness: HarnessFactory,
) -> None:
    harness = agentruns_harness(_flaky_once(), PLAIN, start=START)
    head = await harness.runs.enqueue("flaky", workspace="acme", subject="doc:1")
    behind = await harness.runs.enqueue("plain", workspace="acme", subject="doc:1")

    report = await harness.drain()

    assert report.outcomes == {RunOutcome.REQUEUED: 1, RunOutcome.COMPLETED: 2}
    for run in (head, behind):
        assert (await harness.runs.get(run.id)).end_reason is TerminationReason.COMPLETED
    [answered] = await harness.runs.events(behind.id)
    assert answered.created_at == START + timedelta(seconds=30)  # right after its head's retry
    assert harness.clock.now() == START + timedelta(seconds=30)


async def test_a_queued_run_due_after_its_deadline_is_ended_at_the_deadline(
    agentruns_harness: HarnessFactory,
) -> None:
    harness = agentruns_harness(SLOW_DEADLINE, start=START)
    run = await harness.runs.enqueue(
        "timely", workspace="acme", subject="doc:1", due_at=START + timedelta(hours=1)
    )

    report = await harness.drain()

    ended = await harness.runs.get(run.id)
    assert (ended.end_reason, ended.ended_at) == (
        TerminationReason.DEADLINE_EXCEEDED,
        START + timedelta(minutes=10),
    )
    assert (report.overdue_ended, report.outcomes) == (1, {})
    assert await harness.runs.events(run.id) == []


async def test_a_run_blocked_behind_its_head_is_ended_at_its_deadline_while_it_waits(
    agentruns_harness: HarnessFactory,
) -> None:
    harness = agentruns_harness(_flaky_once(), SLOW_DEADLINE, start=START)
    long_backoff = harness.kinds.get("flaky")
    assert long_backoff.policy.backoff.base == timedelta(seconds=30)
    await harness.runs.enqueue("flaky", workspace="acme", subject="doc:1")
    blocked = await harness.runs.enqueue(
        "timely", workspace="acme", subject="doc:1", deadline_at=START + timedelta(seconds=10)
    )

    report = await harness.drain()

    ended = await harness.runs.get(blocked.id)
    assert (ended.end_reason, ended.ended_at) == (
        TerminationReason.DEADLINE_EXCEEDED,
        START + timedelta(seconds=10),
    )
    assert report.outcomes == {RunOutcome.REQUEUED: 1, RunOutcome.COMPLETED: 1}


async def test_runs_of_a_held_workspace_run_when_the_hold_ends(
    agentruns_harness: HarnessFactory,
) -> None:
    harness = agentruns_harness(PLAIN, start=START)
    until = START + timedelta(minutes=5)
    await harness.runs.hold_budget(BudgetHold("acme", until, "spent"))
    run = await harness.runs.enqueue("plain", workspace="acme", subject="doc:1")

    await harness.drain()

    [answered] = await harness.runs.events(run.id)
    assert answered.created_at == until


async def test_runs_of_an_inactive_workspace_are_left_queued(
    agentruns_harness: HarnessFactory,
) -> None:
    harness = agentruns_harness(PLAIN, start=START)
    await harness.runs.set_workspace_active("retired", False)
    left = await harness.runs.enqueue("plain", workspace="retired", subject="doc:1")
    done = await harness.runs.enqueue("plain", workspace="acme", subject="doc:2")

    report = await harness.drain()

    assert report.outcomes == {RunOutcome.COMPLETED: 1}
    assert (await harness.runs.get(left.id)).state is AgentRunState.QUEUED
    assert (await harness.runs.get(done.id)).state is AgentRunState.ENDED
    assert harness.clock.now() == START


async def test_a_lease_its_holder_lost_is_taken_back_when_it_expires_and_run_again(
    agentruns_harness: HarnessFactory,
) -> None:
    harness = agentruns_harness(PLAIN, start=START)
    run = await harness.runs.enqueue("plain", workspace="acme", subject="doc:1")
    [lost] = await harness.runs.claim("a-worker-that-died")

    report = await harness.drain()

    assert (report.taken_back, report.outcomes) == (1, {RunOutcome.COMPLETED: 1})
    done = await harness.runs.get(run.id)
    assert (done.end_reason, done.epoch, done.attempt) == (TerminationReason.COMPLETED, 2, 1)
    [answered] = await harness.runs.events(run.id)
    assert answered.created_at >= lost.leased_until  # type: ignore[operator]


async def test_drain_without_advance_leaves_the_clock_alone(
    agentruns_harness: HarnessFactory,
) -> None:
    harness = agentruns_harness(PLAIN, start=START)
    later = await harness.runs.enqueue(
        "plain", workspace="acme", subject="doc:1", due_at=START + timedelta(minutes=1)
    )
    report = await harness.drain(advance=False)
    assert (report.outcomes, harness.clock.now()) == ({}, START)
    assert (await harness.runs.get(later.id)).state is AgentRunState.QUEUED
    await harness.drain()
    assert (await harness.runs.get(later.id)).state is AgentRunState.ENDED


async def test_drain_replays_recorded_steps_when_a_run_is_retried(
    agentruns_harness: HarnessFactory,
) -> None:
    """A recorded kind failing after its first step: drain retries it after the backoff, and the
    retry gets the first step's result without running it again."""
    ran: list[str] = []

    async def call(name: str) -> dict[str, str]:
        ran.append(name)
        return {"from": name}

    async def steps(run: AgentRun, ctx: StepContext) -> None:
        drafted = await ctx.step("draft", call, "draft")
        if run.attempt == 0:
            raise ProviderError("overloaded", status=503)
        await ctx.step("publish", call, f"publish {drafted['from']}")

    kind = RunKind(RunKindPolicy(name="drafts", backoff=BACKOFF), RecordedSteps(steps))
    harness = agentruns_harness(kind, start=START)
    run = await harness.runs.enqueue("drafts", workspace="acme", subject="doc:1")

    report = await harness.drain()

    assert report.outcomes == {RunOutcome.REQUEUED: 1, RunOutcome.COMPLETED: 1}
    assert ran == ["draft", "publish draft"]
    events = await harness.runs.events(run.id)
    assert [(event.epoch, event.data["name"]) for event in events] == [
        (1, "draft"),
        (2, "publish"),
    ]
    assert harness.clock.now() == START + timedelta(seconds=30)


async def test_drain_retries_a_step_cancelled_past_its_step_timeout(
    agentruns_harness: HarnessFactory,
) -> None:
    """The step timeout is the process's own time: a hanging first attempt is cancelled, and
    drain retries it after the backoff on the manual clock."""

    async def steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        if run.attempt == 0:
            await asyncio.Event().wait()  # hangs until cancelled
        yield StepEvent("answered")

    policy = RunKindPolicy(name="hangs", backoff=BACKOFF, step_timeout=timedelta(milliseconds=20))
    harness = agentruns_harness(RunKind(policy, steps), start=START)
    run = await harness.runs.enqueue("hangs", workspace="acme", subject="doc:1")

    report = await harness.drain()

    assert report.outcomes == {RunOutcome.REQUEUED: 1, RunOutcome.COMPLETED: 1}
    [failure] = await harness.runs.failures(run.id)
    assert failure.failure_class is FailureClass.TIMEOUT


class _LongCall:
    """A recorded kind whose ``call`` step lasts five of its 30 s leases on the manual clock:
    through ``harness.elapse`` (the heartbeat beats), or, with ``jump``, in one move of the
    clock under the first claim (nothing can renew it)."""

    def __init__(self, *, jump: bool) -> None:
        self.jump = jump
        self.harness: object = None
        self.calls = 0
        self.cancelled = 0

    async def call(self, epoch: int) -> str:
        from agentruns.testing import AgentRunsHarness

        harness = self.harness
        assert isinstance(harness, AgentRunsHarness)
        self.calls += 1
        try:
            if self.jump and epoch == 1:
                harness.clock.advance(LONG_LEASE * 5)
                await harness.elapse(timedelta(0))  # the keeper's look comes too late
            else:
                await harness.elapse(LONG_LEASE * 5)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "answered"

    async def steps(self, run: AgentRun, ctx: StepContext) -> None:
        await ctx.step("call", self.call, run.epoch)


LONG_LEASE = timedelta(seconds=30)


def _long_call(long: _LongCall) -> RunKind:
    policy = RunKindPolicy(name="long-call", lease=LONG_LEASE, backoff=BACKOFF)
    return RunKind(policy, RecordedSteps(long.steps))


async def test_a_step_that_outlasts_its_lease_under_drain_keeps_it_through_the_heartbeat(
    agentruns_harness: HarnessFactory,
) -> None:
    """Two and a half minutes of a 30 s lease pass inside one step: the worker's heartbeat
    renews it as the clock moves, the reaper takes nothing back, and the run completes in its
    first claim, its step run once."""
    long = _LongCall(jump=False)
    harness = agentruns_harness(_long_call(long), start=START)
    long.harness = harness
    run = await harness.runs.enqueue("long-call", workspace="acme", subject="doc:1")

    report = await harness.drain()

    assert report.outcomes == {RunOutcome.COMPLETED: 1}
    assert report.taken_back == 0
    ended = await harness.runs.get(run.id)
    assert ended.end_reason is TerminationReason.COMPLETED
    assert ended.epoch == 1
    assert long.calls == 1
    assert harness.worker.keeper.renewals >= 14  # one every third of a lease


async def test_a_step_that_jumps_past_its_lease_under_drain_loses_it(
    agentruns_harness: HarnessFactory,
) -> None:
    """The same step moving the clock five leases at once: no heartbeat could have run, so its
    boundary's fenced write is refused (nothing recorded), and the run's next claim runs the
    step again, through the heartbeat, to completion."""
    long = _LongCall(jump=True)
    harness = agentruns_harness(_long_call(long), start=START)
    long.harness = harness
    run = await harness.runs.enqueue("long-call", workspace="acme", subject="doc:1")

    report = await harness.drain()

    assert report.outcomes[RunOutcome.LEASE_LOST] == 1
    assert report.outcomes[RunOutcome.COMPLETED] == 1
    assert long.calls == 2
    assert [event.data["name"] for event in await harness.runs.events(run.id)] == ["call"]
    assert (await harness.runs.get(run.id)).end_reason is TerminationReason.COMPLETED


async def test_a_drained_conversation_shows_what_each_policy_did(
    agentruns_harness: HarnessFactory,
) -> None:
    """Messages on one conversation under each policy, then a drain: a rejected one made no
    run, an interrupted one ended cancelled, and the rest were answered in order."""
    harness = agentruns_harness(PLAIN, start=START)
    chat = {"workspace": "acme", "subject": "chat:1"}
    first = await harness.runs.enqueue("plain", **chat, payload={"text": "hi"})
    with pytest.raises(SubjectBusy) as busy:
        await harness.runs.enqueue("plain", **chat, on_active=OnActive.REJECT)
    assert busy.value.run_id == first.id
    queued = await harness.runs.enqueue("plain", **chat, payload={"text": "and"})
    latest = await harness.runs.enqueue(
        "plain", **chat, payload={"text": "no, this"}, on_active=OnActive.INTERRUPT
    )
    report = await harness.drain()
    assert report.outcomes == {RunOutcome.COMPLETED: 1}
    conversation = await harness.conversation("acme", "chat:1")
    assert [(run.payload, run.end_reason) for run in conversation] == [
        ({"text": "hi"}, TerminationReason.CANCELLED),
        ({"text": "and"}, TerminationReason.CANCELLED),
        ({"text": "no, this"}, TerminationReason.COMPLETED),
    ]
    assert [run.id for run in conversation] == [first.id, queued.id, latest.id]


async def test_a_drained_conversation_shows_what_a_merge_did(
    agentruns_harness: HarnessFactory,
) -> None:
    """Three messages in quick succession under merge with a debounce make one run, claimed
    once the messages stopped, answering all three; one after its claim is a run of its own."""
    harness = agentruns_harness(PLAIN, start=START)
    chat = {"workspace": "acme", "subject": "chat:1"}
    window = timedelta(seconds=30)
    first = await harness.runs.enqueue(
        "plain", **chat, payload={"text": "hi"}, on_active="merge", debounce=window
    )
    for text in ("are you", "there?"):
        harness.clock.advance(timedelta(seconds=10))
        joined = await harness.runs.enqueue(
            "plain", **chat, payload={"text": text}, on_active="merge", debounce=window
        )
        assert joined.id == first.id
    report = await harness.drain()
    assert report.outcomes == {RunOutcome.COMPLETED: 1}
    [run] = await harness.conversation("acme", "chat:1")
    assert run.claimed_at == START + timedelta(seconds=50)
    assert await harness.inputs(run.id) == [
        {"text": "hi"},
        {"text": "are you"},
        {"text": "there?"},
    ]
    late = await harness.runs.enqueue("plain", **chat, payload={"text": "!"}, on_active="merge")
    await harness.drain()
    assert [r.id for r in await harness.conversation("acme", "chat:1")] == [first.id, late.id]
    assert await harness.inputs(late.id) == [{"text": "!"}]


async def test_a_recorded_kind_answers_every_merged_message(
    agentruns_harness: HarnessFactory,
) -> None:
    """A recorded kind reads ``ctx.inputs()`` and its result names every message merged in."""

    async def answer(run: AgentRun, ctx: StepContext) -> str:
        texts = [str(entry["text"]) for entry in await ctx.inputs()]
        return await ctx.step("answer", _joined, texts)

    harness = agentruns_harness(
        RunKind(RunKindPolicy(name="answers"), RecordedSteps(answer)), start=START
    )
    chat = {"workspace": "acme", "subject": "chat:2"}
    first = await harness.runs.enqueue("answers", **chat, payload={"text": "a"}, on_active="merge")
    await harness.runs.enqueue("answers", **chat, payload={"text": "b"}, on_active="merge")
    await harness.drain()
    assert (await harness.runs.get(first.id)).result == "a + b"


async def _joined(texts: list[str]) -> str:
    return " + ".join(texts)
