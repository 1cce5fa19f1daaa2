"""A host's kinds with a schedule, as the command line loads them: ``--kinds
tests.e2e.schedule_host:KINDS`` (a heartbeat every second, and a daily digest)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.schedule import Schedule


async def _steps(run: AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("done")


KINDS = RunKinds(
    [
        RunKind(RunKindPolicy(name="heartbeat"), _steps),
        RunKind(RunKindPolicy(name="digest"), _steps),
    ],
    schedules=[
        Schedule(
            "heartbeat",
            kind="heartbeat",
            every=timedelta(seconds=1),
            workspace="ops",
            subject="heartbeat:{tick}",
        ),
        Schedule(
            "daily-digest",
            kind="digest",
            cron="0 7 * * *",
            timezone="Europe/Paris",
            workspace="acme",
            subject="digest:{date}",
        ),
    ],
)

DIGEST_ONLY = RunKinds(
    [RunKind(RunKindPolicy(name="digest"), _steps)],
    schedules=[KINDS.schedules.get("daily-digest")],  # type: ignore[list-item]
)
