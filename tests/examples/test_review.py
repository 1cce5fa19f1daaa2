"""The review example on both adapters, through the worker: its job moves with its run on the
one-run path that kinds with a domain row take (PostgreSQL checks the two agree at commit)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

from agentruns import (
    AgentRun,
    AgentRunState,
    Backoff,
    ProviderError,
    RunKind,
    RunKindPolicy,
    RunOutcome,
    StepEvent,
)
from agentruns.testing import HarnessFactory
from examples.review import ReviewJob, ReviewRunKind, ReviewStatus, review_attempt, review_jobs


async def _review(run: AgentRun) -> AsyncIterator[StepEvent]:
    if run.attempt == 0 and run.payload.get("flaky"):
        raise ProviderError("overloaded", status=503)
    yield StepEvent("commented", {"on": run.subject})


async def test_review_jobs_move_with_their_runs_through_the_worker(
    agentruns_harness: HarnessFactory,
) -> None:
    harness = agentruns_harness()
    jobs = review_jobs(harness.family)
    policy = RunKindPolicy(name="review", backoff=Backoff(base=timedelta(seconds=5), jitter=0))
    harness.kinds.register(RunKind(policy, _review, ReviewRunKind(jobs)))
    plain = await harness.runs.enqueue("review", workspace="acme", subject="pr:1")
    flaky = await harness.runs.enqueue(
        "review", workspace="acme", subject="pr:2", payload={"flaky": True}
    )

    report = await harness.drain()

    assert report.outcomes == {RunOutcome.COMPLETED: 2, RunOutcome.REQUEUED: 1}
    async with harness.runs.transaction() as tx:
        found = [await jobs.get(tx, run.id) for run in (plain, flaky)]
    assert found == [
        ReviewJob(plain.id, "acme", "pr:1", ReviewStatus.ENDED, 1),
        ReviewJob(flaky.id, "acme", "pr:2", ReviewStatus.ENDED, 2),
    ]


def test_the_review_attempt_is_the_epoch_less_one_while_leased() -> None:
    """A waiting job shows the number its next claim takes."""
    leased = _run(AgentRunState.LEASED, epoch=1)
    assert review_attempt(leased) == 0
    assert review_attempt(_run(AgentRunState.QUEUED, epoch=1)) == 1


def _run(state: AgentRunState, epoch: int) -> AgentRun:
    from datetime import UTC, datetime
    from uuid import uuid4

    from agentruns import Band

    now = datetime(2026, 1, 1, tzinfo=UTC)
    return AgentRun(
        id=uuid4(),
        kind="review",
        workspace="acme",
        subject="pr:1",
        band=Band.BATCH,
        payload={},
        state=state,
        epoch=epoch,
        attempt=0,
        seq=1,
        enqueued_at=now,
        due_at=now,
        leased_until=now + timedelta(seconds=30) if state is AgentRunState.LEASED else None,
    )
