"""Run kinds the contract tests drive: scripted steps that succeed, fail or stall on cue."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.domain.backoff import Backoff
from agentruns.domain.failures import FallbackChainExhausted, ProviderError
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from examples.review import ReviewJobs, ReviewRunKind

LEASE = timedelta(seconds=30)
BACKOFF = Backoff(base=timedelta(seconds=10), cap=timedelta(minutes=5), jitter=0.0)


async def scripted_steps(run: AgentRun) -> AsyncIterator[StepEvent]:
    """Steps read their script from the payload: ``{"steps": 2, "fail": 503}``."""
    for index in range(int(run.payload.get("steps", 2))):  # type: ignore[arg-type]
        yield StepEvent("step", {"index": index})
    fail = run.payload.get("fail")
    if fail == "chain":
        raise FallbackChainExhausted(
            [ProviderError("first", status=503), ProviderError("last", status=401)]
        )
    if isinstance(fail, int):
        raise ProviderError(f"provider answered {fail}", status=fail)


def policy(name: str, **changes: object) -> RunKindPolicy:
    return RunKindPolicy(name=name, lease=LEASE, backoff=BACKOFF, **changes)  # type: ignore[arg-type]


def contract_kinds(review_jobs: ReviewJobs) -> RunKinds:
    return RunKinds(
        [
            RunKind(policy("chat"), scripted_steps),
            RunKind(policy("sweep", deadline=timedelta(minutes=30)), scripted_steps),
            RunKind(policy("review"), scripted_steps, ReviewRunKind(review_jobs)),
        ]
    )
