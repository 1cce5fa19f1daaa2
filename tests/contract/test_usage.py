"""What steps spent, on every backend (ADRs/0033): a step boundary's usage in its fenced write,
the run's totals, the usage ledger and a workspace's spend per period."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from agentruns.app.kinds import RunKind, RunKinds, RunResult, StepEvent
from agentruns.app.metrics import NoMetrics
from agentruns.app.ports import RunEvent, StepWrite
from agentruns.app.recorded import RecordedSteps, StepContext
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.errors import InvalidRequest, StaleEpoch
from agentruns.domain.failures import ProviderError
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import RunOutcome, TerminationReason
from agentruns.domain.usage import Spend, Usage
from tests.contract.conftest import START, Backend
from tests.contract.kinds import BACKOFF, policy

DAY = START.replace(hour=0)
LATER = START + timedelta(days=400)


async def _leased(runs: AgentRuns, subject: str, workspace: str = "acme") -> AgentRun:
    await runs.enqueue("chat", workspace=workspace, subject=subject)
    [run] = await runs.claim("w")
    return run


async def test_a_step_s_usage_adds_to_its_run_s_totals_and_the_ledger(runs: AgentRuns) -> None:
    run = await _leased(runs, "s")
    await runs.step_boundary(
        run.fence,
        "step",
        {"n": 1},
        usage=Usage(
            input_tokens=100, output_tokens=20, cost=Decimal("0.0125"), provider="p", model="m"
        ),
    )
    await runs.step_boundary(run.fence, "step", {"n": 2})  # no usage: the totals stay
    await runs.step_boundary(
        run.fence, "step", {"n": 3}, usage=Usage(input_tokens=5, provider="p", model="m")
    )
    got = await runs.get(run.id)
    assert (got.input_tokens, got.output_tokens, got.cost) == (105, 20, Decimal("0.0125"))
    assert [e.seq for e in await runs.events(run.id)] == [1, 2, 3]
    assert await runs.spend("acme", DAY, LATER) == [
        Spend(DAY, "chat", "p", "m", 2, 105, 20, Decimal("0.0125"))
    ]


async def test_a_zombie_holder_records_no_usage(runs: AgentRuns) -> None:
    await runs.enqueue("chat", workspace="acme", subject="stale")
    [first] = await runs.claim("old")
    await runs.requeue(first.fence, charged=False, delay=timedelta(0))
    [second] = await runs.claim("new")
    with pytest.raises(StaleEpoch):
        await runs.step_boundary(first.fence, "step", {}, usage=Usage(input_tokens=7, cost=1))
    got = await runs.get(second.id)
    assert (got.input_tokens, got.output_tokens, got.cost) == (0, 0, 0)
    assert await runs.events(second.id) == []
    assert await runs.spend("acme", DAY, LATER) == []


async def test_a_group_records_the_usage_of_the_writes_that_held(runs: AgentRuns) -> None:
    await runs.enqueue("chat", workspace="acme", subject="stale")
    [first] = await runs.claim("old")
    await runs.requeue(first.fence, charged=False, delay=timedelta(0))
    [taken] = await runs.claim("new")
    a = await _leased(runs, "a")
    b = await _leased(runs, "b")
    results = await runs.settle_group(
        [
            StepWrite(a.fence, "step", {}, Usage(input_tokens=3, cost=Decimal("0.5"), model="m")),
            StepWrite(first.fence, "step", {}, Usage(input_tokens=1000)),
            StepWrite(b.fence, "step", {}),
        ]
    )
    assert isinstance(results[0], RunEvent)
    assert isinstance(results[1], StaleEpoch)
    assert isinstance(results[2], RunEvent)
    totals = [
        (r.input_tokens, r.output_tokens, r.cost)
        for r in [await runs.get(a.id), await runs.get(taken.id), await runs.get(b.id)]
    ]
    assert totals == [(3, 0, Decimal("0.5")), (0, 0, 0), (0, 0, 0)]
    assert await runs.spend("acme", DAY, LATER) == [
        Spend(DAY, "chat", None, "m", 1, 3, 0, Decimal("0.5"))
    ]


async def test_a_group_without_usage_records_none(runs: AgentRuns) -> None:
    a = await _leased(runs, "a")
    [result] = await runs.settle_group([StepWrite(a.fence, "step", {})])
    assert isinstance(result, RunEvent)
    assert await runs.spend("acme", DAY, LATER) == []
    assert (await runs.get(a.id)).input_tokens == 0


async def test_spend_groups_by_utc_period_kind_provider_and_model(
    backend: Backend, runs: AgentRuns
) -> None:
    run = await _leased(runs, "s")
    other = await _leased(runs, "o", workspace="elsewhere")
    await runs.step_boundary(run.fence, "step", {}, usage=Usage(input_tokens=1, provider="b"))
    await runs.step_boundary(run.fence, "step", {}, usage=Usage(input_tokens=2, provider="a"))
    await runs.step_boundary(other.fence, "step", {}, usage=Usage(input_tokens=50))
    backend.clock.advance(timedelta(hours=1))
    later = await _leased(runs, "s2")
    await runs.step_boundary(later.fence, "step", {}, usage=Usage(output_tokens=4, cost=2))
    hour = START.replace(minute=0)
    assert await runs.spend("acme", DAY, LATER, per="hour") == [
        Spend(hour, "chat", "a", None, 1, 2, 0, Decimal(0)),
        Spend(hour, "chat", "b", None, 1, 1, 0, Decimal(0)),
        Spend(hour + timedelta(hours=1), "chat", None, None, 1, 0, 4, Decimal(2)),
    ]
    assert await runs.spend("acme", DAY, LATER, per="month") == [
        Spend(datetime(2026, 3, 1, tzinfo=UTC), "chat", None, None, 1, 0, 4, Decimal(2)),
        Spend(datetime(2026, 3, 1, tzinfo=UTC), "chat", "a", None, 1, 2, 0, Decimal(0)),
        Spend(datetime(2026, 3, 1, tzinfo=UTC), "chat", "b", None, 1, 1, 0, Decimal(0)),
    ]
    # [since, until): the window's end is left out.
    assert await runs.spend("acme", DAY, hour + timedelta(hours=1)) == [
        Spend(DAY, "chat", "a", None, 1, 2, 0, Decimal(0)),
        Spend(DAY, "chat", "b", None, 1, 1, 0, Decimal(0)),
    ]
    assert [s.input_tokens for s in await runs.spend("elsewhere", DAY, LATER)] == [50]


async def test_bad_usage_is_refused_and_writes_nothing(runs: AgentRuns) -> None:
    run = await _leased(runs, "s")
    for bad in (
        dict(input_tokens=-1),
        dict(output_tokens=2**63),
        dict(input_tokens=True),
        dict(cost=float("nan")),
        dict(cost=-1),
        dict(cost="1"),
        dict(cost=Decimal("0.0000000001")),
        dict(provider=""),
        dict(model="x" * 600),
    ):
        with pytest.raises(InvalidRequest):
            Usage(**bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        await runs.step_boundary(run.fence, "step", {}, usage="lots")  # type: ignore[arg-type]
    [refused] = await runs.settle_group(
        [StepWrite(run.fence, "step", {}, "lots")]  # type: ignore[arg-type]
    )
    assert isinstance(refused, InvalidRequest)
    assert await runs.events(run.id) == []
    with pytest.raises(InvalidRequest):
        await runs.spend("acme", DAY, LATER, per="week")
    with pytest.raises(InvalidRequest):
        await runs.spend("acme", LATER, DAY)
    with pytest.raises(InvalidRequest):
        await runs.spend("acme", DAY.replace(tzinfo=None), LATER)


async def test_a_purged_run_s_usage_stays_in_the_workspace_s_spend(
    backend: Backend, runs: AgentRuns
) -> None:
    run = await _leased(runs, "s")
    await runs.step_boundary(run.fence, "step", {}, usage=Usage(input_tokens=9))
    await runs.end(run.fence, TerminationReason.COMPLETED)
    backend.clock.advance(timedelta(days=2))
    assert await runs.purge(timedelta(days=1)) == 1
    assert [s.input_tokens for s in await runs.spend("acme", DAY, LATER)] == [9]


class _Spent(NoMetrics):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Usage]] = []

    def spent(self, workspace: str, kind: str, usage: Usage) -> None:
        self.seen.append((workspace, kind, usage))


@pytest.mark.parametrize("group_commit", [True, False], ids=["grouped", "alone"])
async def test_a_generator_s_steps_report_usage_through_the_worker(
    backend: Backend, runs: AgentRuns, kinds: RunKinds, group_commit: bool
) -> None:
    async def steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        yield StepEvent("ask", {}, usage=Usage(input_tokens=10, output_tokens=1, model="m"))
        yield StepEvent("think", {})
        yield StepEvent("ask", {}, usage=Usage(input_tokens=5, cost=Decimal("0.25"), model="m"))
        yield RunResult("done")

    kinds.register(RunKind(policy("spender"), steps))
    metrics = _Spent()
    worker = Worker(
        runs,
        kinds,
        backend.stores.notifier,
        random.Random(3),
        holder="w",
        group_commit=group_commit,
        metrics=metrics,
    )
    run = await runs.enqueue("spender", workspace="acme", subject="s")
    [claimed] = await runs.claim(worker.holder)
    assert await worker.drive(claimed) is RunOutcome.COMPLETED
    got = await runs.get(run.id)
    assert (got.input_tokens, got.output_tokens, got.cost) == (15, 1, Decimal("0.25"))
    assert [(w, k, u.input_tokens) for w, k, u in metrics.seen] == [
        ("acme", "spender", 10),
        ("acme", "spender", 5),
    ]
    assert await runs.spend("acme", DAY, LATER) == [
        Spend(DAY, "spender", None, "m", 2, 15, 1, Decimal("0.25"))
    ]


async def test_a_recorded_step_reports_from_inside_its_work_and_a_replay_reports_nothing(
    backend: Backend, runs: AgentRuns, kinds: RunKinds
) -> None:
    attempts: list[int] = []

    async def call(ctx: StepContext, tokens: int) -> str:
        ctx.spent(Usage(input_tokens=tokens, provider="p"))
        ctx.spent(Usage(output_tokens=1))
        return "ok"

    async def agent(run: AgentRun, ctx: StepContext) -> None:
        attempts.append(run.epoch)
        with pytest.raises(InvalidRequest):
            ctx.spent(Usage(input_tokens=1))  # between steps: refused
        await ctx.step("plan", call, ctx, 100)
        if run.epoch == 1:
            raise ProviderError("overloaded", status=503)
        await ctx.step("act", call, ctx, 7)

    kinds.register(RunKind(policy("agent"), RecordedSteps(agent)))
    worker = Worker(runs, kinds, backend.stores.notifier, random.Random(5), holder="w")
    run = await runs.enqueue("agent", workspace="acme", subject="s")
    [first] = await runs.claim(worker.holder)
    assert await worker.drive(first) is RunOutcome.REQUEUED
    backend.clock.advance(BACKOFF.base)
    [second] = await runs.claim(worker.holder)
    assert await worker.drive(second) is RunOutcome.COMPLETED
    assert attempts == [1, 2]
    got = await runs.get(run.id)
    assert (got.input_tokens, got.output_tokens) == (107, 2)
    [spent] = await runs.spend("acme", DAY, LATER)
    assert (spent.provider, spent.steps, spent.input_tokens) == ("p", 2, 107)


async def test_spend_by_workspace_sums_each_workspace_most_cost_first(
    backend: Backend, runs: AgentRuns
) -> None:
    a = await _leased(runs, "a", workspace="acme")
    b = await _leased(runs, "b", workspace="beta")
    c = await _leased(runs, "c", workspace="cheap")
    await runs.step_boundary(a.fence, "step", {}, usage=Usage(input_tokens=5, cost=1))
    await runs.step_boundary(a.fence, "step", {}, usage=Usage(output_tokens=5, cost=2))
    await runs.step_boundary(b.fence, "step", {}, usage=Usage(input_tokens=1, cost=7))
    await runs.step_boundary(c.fence, "step", {}, usage=Usage(input_tokens=1))
    found = await runs.spend_by_workspace(DAY, LATER)
    assert [(s.workspace, s.steps, s.input_tokens, s.output_tokens, s.cost) for s in found] == [
        ("beta", 1, 1, 0, Decimal(7)),
        ("acme", 2, 5, 5, Decimal(3)),
        ("cheap", 1, 1, 0, Decimal(0)),
    ]
    assert await runs.spend_by_workspace(LATER, LATER) == []
    with pytest.raises(InvalidRequest):
        await runs.spend_by_workspace(LATER, DAY)
