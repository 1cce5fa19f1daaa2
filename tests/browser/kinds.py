"""The kinds the browser tier's worker runs: short steps that drain, a dead letter, a flaky run
that succeeds on its second attempt, a run whose event carries a provider key, a long run
that renews its lease every half second, and a recorded run that waits for an approval."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import agentruns

QUICK = timedelta(seconds=1)


async def drain(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    for index in range(3):
        await asyncio.sleep(0.25)
        yield agentruns.StepEvent("step", {"index": index, "of": run.subject})


async def dead(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    yield agentruns.StepEvent("called the model", {"model": "m-1"})
    raise agentruns.ProviderError("the API key was revoked", status=401)


async def flaky(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    yield agentruns.StepEvent("attempt", {"attempt": run.attempt})
    if run.attempt == 0:
        raise agentruns.ProviderError("the model is overloaded", status=503)
    yield agentruns.StepEvent("answered", {"words": 42})


PROVIDER_KEY = "sk-proj-BROWSERTIER0123456789"


async def keyed(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    """A step whose event carries the provider key it called with (a habit of hosts)."""
    yield agentruns.StepEvent("called the model", {"model": "m-1", "api_key": PROVIDER_KEY})


async def long(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    for index in range(240):
        await asyncio.sleep(0.5)
        yield agentruns.StepEvent("tick", {"index": index})


async def approve(run: agentruns.AgentRun, ctx: agentruns.StepContext) -> None:
    """Waits up to an hour for the signal ``approval``, then records what it got."""
    got = await ctx.wait_for("approval", timeout=timedelta(hours=1))
    await ctx.step("report", _echo, got)


async def _echo(value: object) -> object:
    return value


def _policy(name: str, **changes: object) -> agentruns.RunKindPolicy:
    backoff = agentruns.Backoff(base=QUICK, cap=QUICK, jitter=0.0)
    return agentruns.RunKindPolicy(name=name, backoff=backoff, **changes)  # type: ignore[arg-type]


KINDS = agentruns.RunKinds(
    [
        agentruns.RunKind(_policy("drain"), drain),
        agentruns.RunKind(_policy("dead"), dead),
        agentruns.RunKind(_policy("flaky"), flaky),
        agentruns.RunKind(_policy("keyed"), keyed),
        agentruns.RunKind(_policy("long", lease=timedelta(seconds=20)), long),
        agentruns.RunKind(_policy("approve"), agentruns.RecordedSteps(approve)),
    ],
    schedules=[
        agentruns.Schedule(
            "hourly-digest",
            kind="drain",
            cron="0 * * * *",
            timezone="Europe/Paris",
            workspace="acme",
            subject="d:{tick}",
        )
    ],
)
