"""Durable waits, signals and sleeps on every backend (ADRs/0025): a waiting run is a queued run
that is not due, still its subject's head, and spends no attempt."""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest

from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.recorded import RecordedSteps, StepContext
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.errors import InvalidRequest, RunAlreadyEnded, RunNotFound, WaitTimedOut
from agentruns.domain.limits import MAX_JSON_BYTES
from agentruns.domain.recorded_steps import RECORDED_STEP
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome, TerminationReason
from agentruns.testing import HarnessFactory
from tests.contract.conftest import Backend
from tests.contract.kinds import policy

TIMEOUT = timedelta(hours=24)
NAP = timedelta(minutes=30)


class Approver:
    """A recorded kind ``approve``: plans, waits for ``approval`` (a timeout it catches when
    the payload says ``catch``), then reports what it got; ``napper`` plans, sleeps, reports."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self.got: list[object] = []

    async def call(self, run: AgentRun, name: str) -> str:
        self.calls.append((run.epoch, name))
        return name

    async def approve(self, run: AgentRun, ctx: StepContext) -> None:
        await ctx.step("plan", self.call, run, "plan")
        try:
            self.got.append(await ctx.wait_for("approval", timeout=TIMEOUT))
        except WaitTimedOut:
            if not run.payload.get("catch"):
                raise
            self.got.append("timed out")
        await ctx.step("report", self.call, run, "report")

    async def nap(self, run: AgentRun, ctx: StepContext) -> None:
        await ctx.step("plan", self.call, run, "plan")
        await ctx.sleep(NAP)
        await ctx.step("report", self.call, run, "report")


@pytest.fixture
def approver(kinds: RunKinds) -> Approver:
    approver = Approver()
    kinds.register(
        RunKind(policy("approve", deadline=timedelta(days=7)), RecordedSteps(approver.approve))
    )
    kinds.register(RunKind(policy("napper"), RecordedSteps(approver.nap)))
    return approver


async def drive_one(runs: AgentRuns, worker: Worker) -> RunOutcome | None:
    claimed = await runs.claim(worker.holder)
    if not claimed:
        return None
    return await worker.drive(claimed[0])


def recorded(events: list[object]) -> list[tuple[int, object, object]]:
    return [
        (event.epoch, event.data["name"], event.data["result"])  # type: ignore[attr-defined]
        for event in events
        if event.type == RECORDED_STEP  # type: ignore[attr-defined]
    ]


async def test_a_wait_gives_the_lease_back_and_a_signal_resumes_it(
    runs: AgentRuns, worker: Worker, backend: Backend, approver: Approver
) -> None:
    """The wait frees the lease in one write, spends no attempt, is not claimable until the
    signal; the signal makes it due and its next claim replays and returns the payload."""
    run = await runs.enqueue("approve", workspace="acme", subject="s")
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    waiting = await runs.get(run.id)
    assert waiting.state is AgentRunState.QUEUED
    assert (waiting.attempt, waiting.epoch, waiting.holder) == (0, 1, None)
    assert waiting.waiting_for == "approval"
    assert waiting.waiting_until == backend.clock.now() + TIMEOUT
    assert waiting.waiting_since == backend.clock.now()  # the park's time
    assert waiting.due_at == waiting.waiting_until
    assert await runs.claim(worker.holder) == []  # not due until the signal
    listed = await runs.list_runs(state="waiting")
    assert [found.id for found in listed.runs] == [run.id]

    delivered = await runs.signal(run.id, "approval", {"ok": True}, signal_id="mail-1")
    assert delivered.created
    assert delivered.signal.payload == {"ok": True}
    woken = await runs.get(run.id)
    assert woken.waiting_until is None
    assert woken.waiting_since is None
    assert woken.due_at <= backend.clock.now()
    assert (await runs.list_runs(state="waiting")).runs == []

    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    assert approver.got == [{"ok": True}]
    assert approver.calls == [(1, "plan"), (2, "report")]  # plan replayed, not run again
    done = await runs.get(run.id)
    assert (done.end_reason, done.attempt, done.epoch) == (TerminationReason.COMPLETED, 0, 2)
    assert recorded(await runs.events(run.id)) == [
        (1, "plan", "plan"),
        (2, "wait:approval", {"signal_id": "mail-1", "payload": {"ok": True}}),
        (2, "report", "report"),
    ]
    assert worker.stats.outcomes.get(RunOutcome.FAILED) is None


async def test_a_signal_before_the_wait_is_kept_and_returned_at_once(
    runs: AgentRuns, worker: Worker, approver: Approver
) -> None:
    """A signal that comes first is the wait's answer: the lease is never given back."""
    run = await runs.enqueue("approve", workspace="acme", subject="s")
    await runs.signal(run.id, "approval", "yes")
    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    assert approver.got == ["yes"]
    done = await runs.get(run.id)
    assert (done.epoch, done.attempt) == (1, 0)


async def test_a_signal_id_is_delivered_once(
    runs: AgentRuns, worker: Worker, approver: Approver
) -> None:
    """A retried delivery with the same id writes nothing and answers the first's signal."""
    run = await runs.enqueue("approve", workspace="acme", subject="s")
    first = await runs.signal(run.id, "approval", {"n": 1}, signal_id="once")
    again = await runs.signal(run.id, "approval", {"n": 2}, signal_id="once")
    assert first.created
    assert not again.created
    assert again.signal == first.signal
    assert again.signal.payload == {"n": 1}
    assert len(await runs.signals(run.id)) == 1
    # Without an id, each delivery is a signal of its own.
    await runs.signal(run.id, "other", None)
    await runs.signal(run.id, "other", None)
    assert [signal.name for signal in await runs.signals(run.id)] == ["approval", "other", "other"]
    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    # After the end, the same id still answers the same; a new one is refused.
    after = await runs.signal(run.id, "approval", {"n": 3}, signal_id="once")
    assert not after.created
    assert after.signal == first.signal


async def test_a_signal_to_an_ended_or_unknown_run_is_refused(
    runs: AgentRuns, worker: Worker, approver: Approver
) -> None:
    run = await runs.enqueue("approve", workspace="acme", subject="s")
    await runs.cancel(run.id)
    with pytest.raises(RunAlreadyEnded, match="ended cancelled"):
        await runs.signal(run.id, "approval", {"ok": True})
    assert await runs.signals(run.id) == []
    other = await runs.enqueue("approve", workspace="acme", subject="t")
    await runs.cancel(other.id)
    unknown = other.id.__class__(int=other.id.int ^ 1)
    with pytest.raises(RunNotFound):
        await runs.signal(unknown, "approval", {"ok": True})


async def test_a_timeout_raises_where_the_kind_waits(
    runs: AgentRuns, worker: Worker, backend: Backend, approver: Approver
) -> None:
    """Past the timeout the run is due again; the wait raises WaitTimedOut, which the kind may
    catch; uncaught, the run ends not_retryable with its failure record."""
    caught = await runs.enqueue("approve", workspace="acme", subject="a", payload={"catch": True})
    left = await runs.enqueue("approve", workspace="acme", subject="b")
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    backend.clock.advance(TIMEOUT - timedelta(seconds=1))
    assert await runs.claim(worker.holder) == []
    backend.clock.advance(timedelta(seconds=1))
    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    assert await drive_one(runs, worker) is RunOutcome.FAILED
    assert approver.got == ["timed out"]
    assert (await runs.get(caught.id)).end_reason is TerminationReason.COMPLETED
    ended = await runs.get(left.id)
    assert (ended.end_reason, ended.attempt) == (TerminationReason.NOT_RETRYABLE, 0)
    [failure] = await runs.failures(left.id)
    assert failure.error_type.endswith("WaitTimedOut")
    # A signal after the timeout changes nothing: the run ended.
    with pytest.raises(RunAlreadyEnded):
        await runs.signal(left.id, "approval", None)


@pytest.mark.parametrize("claimer", ["all kinds", "some kinds", "a subject"])
async def test_every_claim_takes_a_wait_whose_end_has_passed(
    runs: AgentRuns, worker: Worker, backend: Backend, approver: Approver, claimer: str
) -> None:
    """A wait or a sleep is kept out of the claims while it lasts (ADRs/0029), and each way of
    claiming takes it once its end has passed: a worker's claim of every kind, a claim of some
    kinds once another kind was seen, and a sandbox's claim of its subject."""
    waiting = await runs.enqueue("approve", workspace="acme", subject="a", payload={"catch": True})
    asleep = await runs.enqueue("napper", workspace="acme", subject="b")
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    if claimer == "some kinds":
        await runs.enqueue("chat", workspace="other", subject="c")  # a kind outside the claim
    ours = ["approve", "napper"]

    async def claim() -> list[AgentRun]:
        if claimer == "all kinds":
            return await runs.claim(worker.holder, limit=2)
        if claimer == "some kinds":
            return await runs.claim(worker.holder, limit=2, kinds=ours)
        found = [
            await runs.claim_subject(worker.holder, "acme", subject, kinds=ours)
            for subject in ("a", "b")
        ]
        return [run for run in found if run is not None]

    backend.clock.advance(NAP - timedelta(seconds=1))
    assert await claim() == []
    backend.clock.advance(timedelta(seconds=1))  # the sleep ends; the wait goes on
    [woke] = await claim()
    assert woke.id == asleep.id
    assert await worker.drive(woke) is RunOutcome.COMPLETED
    backend.clock.advance(TIMEOUT - NAP - timedelta(seconds=1))
    assert await claim() == []
    backend.clock.advance(timedelta(seconds=1))  # the wait times out
    [timed_out] = await claim()
    assert (timed_out.id, timed_out.epoch, timed_out.attempt) == (waiting.id, 2, 0)
    assert await worker.drive(timed_out) is RunOutcome.COMPLETED
    assert approver.got == ["timed out"]
    assert approver.calls.count((2, "report")) == 2


async def test_a_sleep_gives_the_lease_back_until_its_end(
    runs: AgentRuns, worker: Worker, backend: Backend, approver: Approver
) -> None:
    run = await runs.enqueue("napper", workspace="acme", subject="s")
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    asleep = await runs.get(run.id)
    assert (asleep.waiting_for, asleep.waiting_until) == (None, backend.clock.now() + NAP)
    # A signal does not wake a sleep.
    await runs.signal(run.id, "sleep", None)
    assert await runs.claim(worker.holder) == []
    backend.clock.advance(NAP)
    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    assert approver.calls == [(1, "plan"), (2, "report")]
    done = await runs.get(run.id)
    assert (done.attempt, done.end_reason) == (0, TerminationReason.COMPLETED)
    assert [name for _, name, _ in recorded(await runs.events(run.id))] == [
        "plan",
        "sleep",
        "report",
    ]


async def test_the_deadline_ends_a_waiting_run(
    runs: AgentRuns, worker: Worker, reaper: AgentRunReaper, backend: Backend, approver: Approver
) -> None:
    """A waiting run past its deadline (before its timeout) is ended by the reaper."""
    run = await runs.enqueue(
        "approve",
        workspace="acme",
        subject="s",
        deadline_at=backend.clock.now() + timedelta(hours=1),
    )
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    backend.clock.advance(timedelta(hours=1))
    report = await reaper.tick()
    assert report.overdue_ended == 1
    assert (await runs.get(run.id)).end_reason is TerminationReason.DEADLINE_EXCEEDED


async def test_a_waiting_run_can_be_cancelled(
    runs: AgentRuns, worker: Worker, approver: Approver
) -> None:
    run = await runs.enqueue("approve", workspace="acme", subject="s")
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    cancelled = await runs.cancel(run.id)
    assert cancelled.end_reason is TerminationReason.CANCELLED
    assert (await runs.list_runs(state="waiting")).runs == []
    with pytest.raises(RunAlreadyEnded):
        await runs.signal(run.id, "approval", None)


async def test_a_waiting_run_holds_its_subject(
    runs: AgentRuns, worker: Worker, approver: Approver
) -> None:
    """The subject's later run waits behind the waiting one; another subject does not."""
    first = await runs.enqueue("approve", workspace="acme", subject="s")
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    later = await runs.enqueue("approve", workspace="acme", subject="s")
    elsewhere = await runs.enqueue("napper", workspace="acme", subject="t")
    claimed = await runs.claim(worker.holder, limit=10)
    assert [run.id for run in claimed] == [elsewhere.id]
    await runs.end(claimed[0].fence, TerminationReason.COMPLETED)
    await runs.signal(first.id, "approval", "go")
    [resumed] = await runs.claim(worker.holder, limit=10)
    assert resumed.id == first.id
    assert await worker.drive(resumed) is RunOutcome.COMPLETED
    [next_one] = await runs.claim(worker.holder, limit=10)
    assert next_one.id == later.id


async def test_two_waits_for_one_name_take_two_signals(
    runs: AgentRuns, worker: Worker, kinds: RunKinds
) -> None:
    got: list[object] = []

    async def twice(run: AgentRun, ctx: StepContext) -> None:
        got.append(await ctx.wait_for("ok", timeout=TIMEOUT))
        got.append(await ctx.wait_for("ok", timeout=TIMEOUT))

    kinds.register(RunKind(policy("twice"), RecordedSteps(twice)))
    run = await runs.enqueue("twice", workspace="acme", subject="s")
    await runs.signal(run.id, "ok", 1)
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    await runs.signal(run.id, "ok", 2)
    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    assert got == [1, 1, 2]  # the first attempt got 1, the replay 1 again, then 2


async def _ask_then_nap(run: AgentRun, ctx: StepContext) -> None:
    try:
        answer = await ctx.wait_for("approval", timeout=TIMEOUT)
    except WaitTimedOut:
        answer = "no answer"

    async def note() -> object:
        return answer

    await ctx.step("answer", note)
    await ctx.sleep(NAP)
    await ctx.step("after nap", note)


ASK = RunKind(policy("ask"), RecordedSteps(_ask_then_nap))


async def test_the_harness_stops_at_a_wait_and_plays_the_sleep(
    agentruns_harness: HarnessFactory,
) -> None:
    """drain() stops at a wait with no signal (the clock is not moved to its timeout); once
    signalled, the next drain resumes it and plays its sleep on the manual clock."""
    harness = agentruns_harness(ASK)
    started = harness.clock.now()
    run = await harness.runs.enqueue("ask", workspace="acme", subject="s")
    report = await harness.drain()
    assert report.outcomes == Counter({RunOutcome.WAITING: 1})
    assert harness.clock.now() == started
    assert (await harness.runs.get(run.id)).waiting_for == "approval"

    await harness.runs.signal(run.id, "approval", "yes")
    report = await harness.drain()
    assert report.outcomes == Counter({RunOutcome.WAITING: 1, RunOutcome.COMPLETED: 1})
    assert harness.clock.now() == started + NAP
    done = await harness.runs.get(run.id)
    assert (done.end_reason, done.attempt) == (TerminationReason.COMPLETED, 0)
    results = [e.data["result"] for e in await harness.runs.events(run.id)]
    assert results == [
        {"signal_id": results[0]["signal_id"], "payload": "yes"},
        "yes",
        {"slept": True},
        "yes",
    ]  # type: ignore[index]


async def test_the_harness_plays_a_timeout_up_to_until(
    agentruns_harness: HarnessFactory,
) -> None:
    harness = agentruns_harness(ASK)
    started = harness.clock.now()
    run = await harness.runs.enqueue("ask", workspace="acme", subject="s")
    await harness.drain(until=started + TIMEOUT + NAP)
    assert harness.clock.now() == started + TIMEOUT + NAP
    done = await harness.runs.get(run.id)
    assert done.end_reason is TerminationReason.COMPLETED
    results = [e.data["result"] for e in await harness.runs.events(run.id)]
    assert results == [{"timed_out": True}, "no answer", {"slept": True}, "no answer"]


async def test_a_bad_signal_is_refused_and_writes_nothing(
    runs: AgentRuns, worker: Worker, approver: Approver
) -> None:
    run = await runs.enqueue("approve", workspace="acme", subject="s")
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    with pytest.raises(InvalidRequest, match="at most 1048576 bytes"):
        await runs.signal(run.id, "approval", "x" * (MAX_JSON_BYTES - 40))
    with pytest.raises(InvalidRequest, match="non-finite"):
        await runs.signal(run.id, "approval", float("nan"))
    with pytest.raises(InvalidRequest, match="name"):
        await runs.signal(run.id, "", None)
    with pytest.raises(InvalidRequest, match="id"):
        await runs.signal(run.id, "approval", None, signal_id="")
    assert await runs.signals(run.id) == []
    still = await runs.get(run.id)
    assert still.waiting_for == "approval"
    assert await runs.claim(worker.holder) == []


async def test_a_signal_wakes_an_idle_worker_and_a_wait_is_no_failure(
    runs: AgentRuns,
    kinds: RunKinds,
    backend: Backend,
    approver: Approver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker idle on a long poll interval claims the signalled run at once (the wake-up an
    enqueue sends); the wait is logged and counted as waiting, never as a failure."""
    worker = Worker(
        runs, kinds, backend.stores.notifier, random.Random(3), holder="idle", poll_interval=30
    )
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run(stop, grace=1))
    try:
        run = await runs.enqueue("approve", workspace="acme", subject="s")
        await _eventually(lambda: _true(worker.stats.outcomes.get(RunOutcome.WAITING) == 1))
        await asyncio.sleep(0.1)  # the worker is idle again, on its 30 s poll
        with caplog.at_level(logging.INFO, logger="agentruns.worker"):
            await runs.signal(run.id, "approval", "go")
            await _eventually(lambda: _ended(runs, run))
    finally:
        stop.set()
        await loop
    assert (await runs.get(run.id)).end_reason is TerminationReason.COMPLETED
    assert worker.stats.outcomes == {RunOutcome.WAITING: 1, RunOutcome.COMPLETED: 1}
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


async def _true(value: bool) -> bool:
    return value


async def _ended(runs: AgentRuns, run: AgentRun) -> bool:
    return (await runs.get(run.id)).state is AgentRunState.ENDED


async def _eventually(check: Callable[[], Awaitable[bool]], *, seconds: float = 5.0) -> None:
    """Polls ``check`` every 10 ms for at most ``seconds`` (well under the worker's 30 s poll)."""
    for _ in range(int(seconds / 0.01)):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not so within {seconds} s")


async def test_the_overview_and_the_workspaces_count_the_waiting_runs(
    runs: AgentRuns, worker: Worker, backend: Backend, approver: Approver
) -> None:
    """Waiting runs are counted per workspace and overall; the overview lists the soonest ends
    first, at most as many as asked, and a woken run is no longer among them."""
    napping = await runs.enqueue("napper", workspace="acme", subject="n")
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    approving = await runs.enqueue("approve", workspace="globex", subject="a")
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    later = await runs.enqueue("approve", workspace="globex", subject="b")
    backend.clock.advance(timedelta(minutes=1))
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    await runs.enqueue("chat", workspace="acme", subject="q")  # queued, not waiting
    stats = backend.family.stats

    async with backend.stores.scope.transaction() as tx:
        found = await stats.overview(tx, window=timedelta(minutes=10), soon=NAP, waiting=2)
        loads = await stats.workspace_loads(tx)

    assert found.waiting_total == 3
    assert [(wait.run_id, wait.waiting_for) for wait in found.waiting] == [
        (napping.id, None),
        (approving.id, "approval"),
    ]
    assert found.waiting[1].workspace == "globex"
    assert found.waiting[1].waiting_until == (await runs.get(approving.id)).waiting_until
    by_name = {load.workspace: load.waiting for load in loads.loads}
    assert by_name == {"acme": 1, "globex": 2}
    assert loads.waiting == 3

    await runs.signal(later.id, "approval", None)
    async with backend.stores.scope.transaction() as tx:
        found = await stats.overview(tx, window=timedelta(minutes=10), soon=NAP)
        loads = await stats.workspace_loads(tx)
    assert found.waiting_total == 2
    assert later.id not in {wait.run_id for wait in found.waiting}
    assert loads.waiting == 2
