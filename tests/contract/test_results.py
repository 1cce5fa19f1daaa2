"""A run's result on every backend (ADRs/0026): the JSON value its kind ends it with, written with
the end in the same fenced write, and read back by ``get``, listings and a group's end."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from agentruns.app.kinds import NoDomainRow, RunKind, RunKinds, RunResult, StepEvent
from agentruns.app.ports import EndWrite, StepWrite
from agentruns.app.recorded import RecordedSteps, StepContext
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.errors import InvalidRunResult, LeaseLost
from agentruns.domain.failures import FailureClass
from agentruns.domain.limits import MAX_JSON_BYTES
from agentruns.domain.payload import JsonValue
from agentruns.domain.run import AgentRun, AgentRunFence
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome, TerminationReason
from tests.contract.conftest import Backend
from tests.contract.kinds import policy


class Answerer:
    """Kinds that end with a result: ``answer`` (generator: a step, the result, then a step that
    must never run), ``timed`` (the same under a step timeout), ``recorded`` (a recorded kind
    that fails its first attempt after its step when the payload says so), ``bad`` (a result
    that cannot be stored)."""

    def __init__(self) -> None:
        self.after_result: list[str] = []
        self.closed: list[str] = []
        self.calls: list[int] = []

    async def answer(self, run: AgentRun) -> AsyncIterator[StepEvent]:
        try:
            yield StepEvent("thought", {"n": 1})
            yield RunResult({"answer": run.payload.get("q"), "tokens": [1, 2]})
            self.after_result.append(run.kind)
            yield StepEvent("never", {})
        finally:
            self.closed.append(run.kind)

    async def recorded(self, run: AgentRun, ctx: StepContext) -> JsonValue:
        drafted = await ctx.step("draft", self.draft, run)
        if run.payload.get("fail_first") and run.attempt == 0:
            raise TimeoutError("the provider timed out")
        return {"draft": drafted, "epoch": run.epoch}

    async def draft(self, run: AgentRun) -> str:
        self.calls.append(run.epoch)
        return f"draft of {run.subject}"

    async def bad(self, run: AgentRun, ctx: StepContext) -> JsonValue:
        return {"huge": "x" * MAX_JSON_BYTES}


@pytest.fixture
def answerer(kinds: RunKinds) -> Answerer:
    answerer = Answerer()
    kinds.register(RunKind(policy("answer"), answerer.answer))
    kinds.register(RunKind(policy("timed", step_timeout=timedelta(minutes=1)), answerer.answer))
    kinds.register(RunKind(policy("recorded"), RecordedSteps(answerer.recorded)))
    kinds.register(RunKind(policy("bad"), RecordedSteps(answerer.bad)))
    return answerer


async def drive_one(runs: AgentRuns, worker: Worker) -> RunOutcome:
    claimed = await runs.claim(worker.holder)
    assert len(claimed) == 1
    return await worker.drive(claimed[0])


@pytest.mark.parametrize("kind", ["answer", "timed"])
@pytest.mark.parametrize("group_commit", [True, False])
async def test_a_generator_ends_its_run_with_the_result_it_yields(
    runs: AgentRuns,
    kinds: RunKinds,
    backend: Backend,
    answerer: Answerer,
    kind: str,
    group_commit: bool,
) -> None:
    """The result is the run's end: no later step runs, the generator's ``finally`` runs, the
    result is no event, and ``get`` and listings read it back."""
    worker = Worker(
        runs,
        kinds,
        backend.stores.notifier,
        random.Random(3),
        holder="w",
        group_commit=group_commit,
    )
    run = await runs.enqueue(kind, workspace="acme", subject="s", payload={"q": "why"})
    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    done = await runs.get(run.id)
    assert done.end_reason is TerminationReason.COMPLETED
    assert done.result == {"answer": "why", "tokens": [1, 2]}
    assert answerer.after_result == []
    assert answerer.closed == [kind]
    assert [event.type for event in await runs.events(run.id)] == ["thought"]
    listed = await runs.list_runs(workspace="acme")
    assert [found.result for found in listed.runs] == [{"answer": "why", "tokens": [1, 2]}]


async def test_a_run_that_ends_without_a_result_has_none(runs: AgentRuns, worker: Worker) -> None:
    run = await runs.enqueue("chat", workspace="acme", subject="s")
    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    done = await runs.get(run.id)
    assert (done.state, done.result) == (AgentRunState.ENDED, None)


async def test_a_recorded_kind_returns_its_result_from_the_attempt_that_finished(
    runs: AgentRuns, worker: Worker, backend: Backend, answerer: Answerer
) -> None:
    """A failed first attempt leaves no result; the retry replays the step and its return is
    the result."""
    run = await runs.enqueue("recorded", workspace="acme", subject="s", payload={"fail_first": 1})
    assert await drive_one(runs, worker) is RunOutcome.REQUEUED
    assert (await runs.get(run.id)).result is None
    backend.clock.advance(timedelta(hours=1))
    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    done = await runs.get(run.id)
    assert done.result == {"draft": "draft of s", "epoch": 2}
    assert answerer.calls == [1]  # the draft ran once, replayed on the retry


async def test_a_result_that_cannot_be_stored_ends_the_run_not_retryable(
    runs: AgentRuns, worker: Worker, answerer: Answerer
) -> None:
    run = await runs.enqueue("bad", workspace="acme", subject="s")
    assert await drive_one(runs, worker) is RunOutcome.FAILED
    done = await runs.get(run.id)
    assert (done.end_reason, done.result) == (TerminationReason.NOT_RETRYABLE, None)
    [failure] = await runs.failures(run.id)
    assert failure.failure_class is FailureClass.CONFIGURATION
    assert "result" in failure.message


async def test_an_end_with_a_result_is_fenced(runs: AgentRuns, backend: Backend) -> None:
    """A stale holder's end writes no result; a refused result writes no end."""
    run = await runs.enqueue("chat", workspace="acme", subject="s")
    [leased] = await runs.claim("w")
    with pytest.raises(InvalidRunResult):
        await runs.end(leased.fence, TerminationReason.COMPLETED, result=float("nan"))
    assert (await runs.get(run.id)).state is AgentRunState.LEASED
    backend.clock.advance(leased.lease + timedelta(seconds=1))
    with pytest.raises(LeaseLost):
        await runs.end(leased.fence, TerminationReason.COMPLETED, result={"late": True})
    still = await runs.get(run.id)
    assert (still.state, still.result) == (AgentRunState.LEASED, None)


async def test_an_end_answers_the_run_with_its_result_and_a_cancel_has_none(
    runs: AgentRuns,
) -> None:
    first = await runs.enqueue("chat", workspace="acme", subject="a")
    second = await runs.enqueue("chat", workspace="acme", subject="b")
    leased = await runs.claim_subject("w", workspace="acme", subject="a", kinds=["chat"])
    assert leased is not None
    ended = await runs.end(leased.fence, TerminationReason.COMPLETED, result="done")
    assert ended.result == "done"
    assert (await runs.get(first.id)).result == "done"
    cancelled = await runs.cancel(second.id)
    assert cancelled.result is None


async def test_a_group_ends_each_run_with_its_own_result(runs: AgentRuns) -> None:
    """Results and no results in one group; a refused fence in the group writes nothing."""
    for subject in ("a", "b", "c"):
        await runs.enqueue("chat", workspace="acme", subject=subject)
    leased = sorted(await runs.claim("w", limit=3), key=lambda run: run.subject)
    assert len(leased) == 3
    stale = AgentRunFence(leased[2].id, leased[2].workspace, leased[2].epoch + 1)
    answers = await runs.settle_group(
        [
            EndWrite(leased[0].fence, TerminationReason.COMPLETED, [1, {"x": None}]),
            StepWrite(leased[1].fence, "note", {}),
            EndWrite(stale, TerminationReason.COMPLETED, "lost"),
        ]
    )
    assert isinstance(answers[0], AgentRun)
    assert answers[0].result == [1, {"x": None}]
    assert isinstance(answers[2], LeaseLost)
    assert (await runs.get(leased[0].id)).result == [1, {"x": None}]
    assert (await runs.get(leased[2].id)).result is None
    [ended] = await runs.settle_group([EndWrite(leased[1].fence, TerminationReason.COMPLETED)])
    assert isinstance(ended, AgentRun)
    assert ended.result is None


async def test_a_kind_with_a_domain_row_ends_alone_with_its_result(
    runs: AgentRuns, kinds: RunKinds, backend: Backend
) -> None:
    class Rowed(NoDomainRow):
        @property
        def has_domain_row(self) -> bool:
            return True

    async def steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        yield RunResult(42)

    kinds.register(RunKind(policy("rowed"), steps, Rowed()))
    worker = Worker(runs, kinds, backend.stores.notifier, random.Random(1), holder="w")
    run = await runs.enqueue("rowed", workspace="acme", subject="s")
    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    assert (await runs.get(run.id)).result == 42
