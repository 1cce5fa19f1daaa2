"""Recorded steps on every backend: recorded under the fence, replayed on the next claim, never
guessed (ADRs/0022)."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from uuid import UUID

import pytest

from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.ports import RunEvent
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.recorded import RecordedSteps, StepContext
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.failures import FailureClass, ProviderError
from agentruns.domain.limits import MAX_JSON_BYTES
from agentruns.domain.recorded_steps import RECORDED_STEP
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome, TerminationReason
from tests.contract.conftest import Backend
from tests.contract.kinds import BACKOFF, LEASE, policy
from tests.contract.test_worker import other_worker, within


class Agent:
    """A recorded kind ``agent``: plan, act on each planned item, report; it counts every
    execution of a step's function as (epoch, step name), fails with a 503 under ``fail_epochs``
    before reporting, and waits at ``gate`` after planning under ``gate_epochs``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self.fail_epochs: set[int] = set()
        self.gate_epochs: set[int] = set()
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()
        self.seen: list[object] = []
        self.replaying: list[bool] = []  # ctx.replaying as each attempt starts

    async def call(self, run: AgentRun, name: str, result: object) -> object:
        self.calls.append((run.epoch, name))
        return result

    async def steps(self, run: AgentRun, ctx: StepContext) -> None:
        self.replaying.append(ctx.replaying)
        plan = await ctx.step("plan", self.call, run, "plan", {"items": ["lint", "test"]})
        assert isinstance(plan, dict)
        self.seen.append(plan)
        if run.epoch in self.gate_epochs:
            self.reached.set()
            await self.opened.wait()
        items = plan["items"]
        assert isinstance(items, list)
        for item in items:
            self.seen.append(await ctx.step("act", self.call, run, "act", f"did {item}"))
        if run.epoch in self.fail_epochs:
            raise ProviderError("the model is overloaded", status=503)
        await ctx.step("report", self.call, run, "report", None)


@pytest.fixture
def agent(kinds: RunKinds) -> Agent:
    agent = Agent()
    kinds.register(RunKind(policy("agent"), RecordedSteps(agent.steps)))
    return agent


def recorded(events: list[RunEvent]) -> list[tuple[int, object, object, object]]:
    """(epoch, name, occurrence, result) of each event, in log order."""
    return [
        (event.epoch, event.data["name"], event.data["occurrence"], event.data["result"])
        for event in events
        if event.type == RECORDED_STEP
    ]


@pytest.mark.parametrize("group_commit", [True, False], ids=["grouped", "alone"])
async def test_a_retried_run_replays_its_recorded_steps_and_runs_the_rest(
    runs: AgentRuns, kinds: RunKinds, backend: Backend, agent: Agent, group_commit: bool
) -> None:
    """After a failure, the next claim returns the recorded results and runs only what is left,
    whether the worker writes its boundaries with the group or alone."""
    worker = Worker(
        runs,
        kinds,
        backend.stores.notifier,
        random.Random(5),
        holder="worker-1",
        group_commit=group_commit,
    )
    agent.fail_epochs = {1}
    run = await runs.enqueue("agent", workspace="acme", subject="s")
    [first] = await runs.claim(worker.holder)
    assert await worker.drive(first) is RunOutcome.REQUEUED
    assert agent.calls == [(1, "plan"), (1, "act"), (1, "act")]

    backend.clock.advance(BACKOFF.base)
    [second] = await runs.claim(worker.holder)
    assert await worker.drive(second) is RunOutcome.COMPLETED

    assert agent.calls == [(1, "plan"), (1, "act"), (1, "act"), (2, "report")]
    plan = {"items": ["lint", "test"]}
    assert agent.seen == [plan, "did lint", "did test"] * 2  # the same results, replayed
    assert agent.replaying == [False, True]
    assert recorded(await runs.events(run.id)) == [
        (1, "plan", 1, plan),
        (1, "act", 1, "did lint"),
        (1, "act", 2, "did test"),
        (2, "report", 1, None),
    ]
    done = await runs.get(run.id)
    assert (done.end_reason, done.attempt) == (TerminationReason.COMPLETED, 1)


async def test_a_take_back_resumes_after_the_recorded_steps_and_the_zombie_records_nothing(
    runs: AgentRuns,
    worker: Worker,
    reaper: AgentRunReaper,
    kinds: RunKinds,
    backend: Backend,
    agent: Agent,
) -> None:
    """A holder that stalled past its lease loses its run; the next holder replays the recorded
    plan; the stalled holder's later step runs but its record is refused by the fence."""
    agent.gate_epochs = {1}
    run = await runs.enqueue("agent", workspace="acme", subject="s")
    [leased] = await runs.claim(worker.holder)
    zombie = asyncio.create_task(worker.drive(leased))
    await within(agent.reached.wait())

    backend.clock.advance(LEASE)
    assert (await reaper.tick()).requeued == 1
    backend.clock.advance(BACKOFF.base)
    second = other_worker(backend, runs, kinds, "worker-2")
    [again] = await runs.claim(second.holder)
    assert again.epoch == 2
    assert await second.drive(again) is RunOutcome.COMPLETED
    assert agent.calls == [(1, "plan"), (2, "act"), (2, "act"), (2, "report")]

    agent.opened.set()
    assert await within(zombie) is RunOutcome.LEASE_LOST
    assert agent.calls[-1] == (1, "act")  # it ran, and was not recorded
    assert recorded(await runs.events(run.id)) == [
        (1, "plan", 1, {"items": ["lint", "test"]}),
        (2, "act", 1, "did lint"),
        (2, "act", 2, "did test"),
        (2, "report", 1, None),
    ]
    assert (await runs.get(run.id)).end_reason is TerminationReason.COMPLETED


async def test_a_holder_whose_lease_expired_records_nothing(
    runs: AgentRuns, worker: Worker, backend: Backend, agent: Agent
) -> None:
    """The renewal comes first: a step finished after the lease ran out is not recorded."""
    agent.gate_epochs = {1}
    run = await runs.enqueue("agent", workspace="acme", subject="s")
    [leased] = await runs.claim(worker.holder)
    holder = asyncio.create_task(worker.drive(leased))
    await within(agent.reached.wait())
    backend.clock.advance(LEASE)
    agent.opened.set()

    assert await within(holder) is RunOutcome.LEASE_LOST
    assert [name for _, name, _, _ in recorded(await runs.events(run.id))] == ["plan"]
    assert (await runs.get(run.id)).state is AgentRunState.LEASED  # left to the reaper


class Drifting:
    """A recorded kind ``drifting`` whose code asks for other steps on its second claim."""

    def __init__(self) -> None:
        self.second: list[str] = ["b"]
        self.ran: list[str] = []

    async def steps(self, run: AgentRun, ctx: StepContext) -> None:
        for name in ["a", "a"] if run.epoch == 1 else self.second:
            await ctx.step(name, self.note, name)
        if run.epoch == 1:
            raise ProviderError("overloaded", status=503)

    async def note(self, name: str) -> str:
        self.ran.append(name)
        return name


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (["b"], "step 'b' was asked for where step 'a' was recorded (recorded step 1 of 2)"),
        (["a", "b"], "step 'b' was asked for where step 'a #2' was recorded"),
        (["a"], "the run returned without asking for its recorded step 'a #2'"),
    ],
    ids=["other-name", "other-occurrence", "fewer-steps"],
)
async def test_a_step_asked_for_out_of_its_recorded_order_ends_the_run_not_retryable(
    runs: AgentRuns,
    worker: Worker,
    kinds: RunKinds,
    backend: Backend,
    second: list[str],
    message: str,
) -> None:
    """A resumed run that no longer follows its recorded steps fails, naming the step; nothing
    is guessed and no retry is spent on it."""
    drifting = Drifting()
    drifting.second = second
    kinds.register(
        RunKind(
            policy("drifting"),
            RecordedSteps(drifting.steps),
            classifier=lambda error: FailureClass.SERVER_ERROR,  # asked, and overruled
        )
    )
    run = await runs.enqueue("drifting", workspace="acme", subject="s")
    [first] = await runs.claim(worker.holder)
    assert await worker.drive(first) is RunOutcome.REQUEUED
    backend.clock.advance(BACKOFF.base)
    [again] = await runs.claim(worker.holder)
    assert await worker.drive(again) is RunOutcome.FAILED

    assert drifting.ran == ["a", "a"]  # nothing ran on the second claim
    done = await runs.get(run.id)
    assert done.end_reason is TerminationReason.NOT_RETRYABLE
    [_, failure] = await runs.failures(run.id)
    assert (failure.error_type, failure.failure_class) == (
        "agentruns.StepOutOfOrder",
        FailureClass.CONFIGURATION,
    )
    assert message in failure.message
    assert len(recorded(await runs.events(run.id))) == 2


async def test_steps_asked_for_at_once_are_refused(
    runs: AgentRuns, worker: Worker, kinds: RunKinds
) -> None:
    """Two steps of one run at the same time would record in either order: the second is
    refused, the run ends not_retryable."""

    async def slow(value: int) -> int:
        await asyncio.sleep(0.01)
        return value

    async def steps(run: AgentRun, ctx: StepContext) -> None:
        await asyncio.gather(ctx.step("a", slow, 1), ctx.step("b", slow, 2))

    kinds.register(RunKind(policy("fanned"), RecordedSteps(steps)))
    run = await runs.enqueue("fanned", workspace="acme", subject="s")
    [leased] = await runs.claim(worker.holder)
    assert await within(worker.drive(leased)) is RunOutcome.FAILED
    [failure] = await runs.failures(run.id)
    assert "step 'b' was asked for while step 'a' runs" in failure.message
    assert (await runs.get(run.id)).end_reason is TerminationReason.NOT_RETRYABLE


class Returns:
    """A recorded kind ``returns`` whose one step returns what the payload's ``result`` says."""

    def __init__(self) -> None:
        self.after: list[object] = []

    async def steps(self, run: AgentRun, ctx: StepContext) -> None:
        result = await ctx.step("answer", self.answer, str(run.payload["result"]))
        self.after.append(result)

    async def answer(self, what: str) -> object:
        match what:
            case "too-large":
                return "x" * MAX_JSON_BYTES
            case "a-set":
                return {"ids": {1, 2}}
            case "an-instance":
                return object()
            case _:
                return {"tuple": (1, 2.5, "three")}


@pytest.mark.parametrize(
    ("what", "detail"),
    [
        ("too-large", f"larger than {MAX_JSON_BYTES} bytes"),
        ("a-set", "holds a set at the result.ids, not a JSON value"),
        ("an-instance", "holds a object at the result, not a JSON value"),
    ],
)
async def test_a_result_too_large_or_not_json_is_refused_and_nothing_is_recorded(
    runs: AgentRuns, worker: Worker, kinds: RunKinds, what: str, detail: str
) -> None:
    """A result that cannot be recorded ends the run not_retryable with a clear message."""
    returns = Returns()
    kinds.register(RunKind(policy("returns"), RecordedSteps(returns.steps)))
    run = await runs.enqueue("returns", workspace="acme", subject="s", payload={"result": what})
    [leased] = await runs.claim(worker.holder)
    assert await worker.drive(leased) is RunOutcome.FAILED

    assert returns.after == []
    assert await runs.events(run.id) == []
    assert (await runs.get(run.id)).end_reason is TerminationReason.NOT_RETRYABLE
    [failure] = await runs.failures(run.id)
    assert failure.error_type == "agentruns.InvalidStepResult"
    assert failure.failure_class is FailureClass.CONFIGURATION
    assert "step 'answer' returned a result that cannot be recorded" in failure.message
    assert detail in failure.message


async def test_a_recorded_result_is_the_json_a_later_attempt_reads(
    runs: AgentRuns, worker: Worker, kinds: RunKinds
) -> None:
    """The code gets the recorded copy (a tuple comes back a list), as a replay would."""
    returns = Returns()
    kinds.register(RunKind(policy("returns"), RecordedSteps(returns.steps)))
    run = await runs.enqueue("returns", workspace="acme", subject="s", payload={"result": "ok"})
    [leased] = await runs.claim(worker.holder)
    assert await worker.drive(leased) is RunOutcome.COMPLETED
    assert returns.after == [{"tuple": [1, 2.5, "three"]}]
    assert recorded(await runs.events(run.id)) == [(1, "answer", 1, {"tuple": [1, 2.5, "three"]})]


class CountingRuns(AgentRuns):
    """AgentRuns that counts the reads of a run's events."""

    reads = 0

    async def events(
        self, run_id: UUID, *, after_seq: int = 0, limit: int | None = None
    ) -> list[RunEvent]:
        self.reads += 1
        return await super().events(run_id, after_seq=after_seq, limit=limit)


async def test_a_first_attempt_reads_no_history_and_a_resumed_one_reads_it_once(
    backend: Backend, kinds: RunKinds, agent: Agent
) -> None:
    """Replay costs a first claim nothing, and a resumed run one read."""
    counting = CountingRuns(backend.stores, kinds, random.Random(3))
    worker = Worker(counting, kinds, backend.stores.notifier, random.Random(3), holder="w")
    agent.fail_epochs = {1}
    await counting.enqueue("agent", workspace="acme", subject="s")
    [first] = await counting.claim(worker.holder)
    assert await worker.drive(first) is RunOutcome.REQUEUED
    assert counting.reads == 0
    backend.clock.advance(timedelta(seconds=10))
    [second] = await counting.claim(worker.holder)
    assert await worker.drive(second) is RunOutcome.COMPLETED
    assert counting.reads == 1


async def test_a_host_running_recorded_steps_itself_gets_their_events(
    runs: AgentRuns, agent: Agent
) -> None:
    """Called as a plain generator (no renewal, no record), every step runs and yields its
    record; nothing is written."""
    run = await runs.enqueue("agent", workspace="acme", subject="s")
    [leased] = await runs.claim("host")
    events = [event async for event in RecordedSteps(agent.steps)(leased)]
    assert await runs.events(run.id) == []
    assert [(event.type, event.data["name"]) for event in events] == [
        (RECORDED_STEP, "plan"),
        (RECORDED_STEP, "act"),
        (RECORDED_STEP, "act"),
        (RECORDED_STEP, "report"),
    ]
