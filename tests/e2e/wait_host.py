"""A host's kind that waits for an approval, as the command line loads it: ``--kinds
tests.e2e.wait_host:KINDS`` (``approve`` waits a day for ``approval`` and records what came)."""

from __future__ import annotations

from datetime import timedelta

from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.recorded import RecordedSteps, StepContext
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun


async def _approve(run: AgentRun, ctx: StepContext) -> None:
    approval = await ctx.wait_for("approval", timeout=timedelta(days=1))

    async def report() -> object:
        return approval

    await ctx.step("report", report)


KINDS = RunKinds([RunKind(RunKindPolicy(name="approve"), RecordedSteps(_approve))])
