"""The README example: a host tests its own run kind in memory with ``agentruns.testing``.

Everything after this docstring up to the end marker is the README's snippet, character for
character; the last test keeps the two identical.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import agentruns.testing
from agentruns.app.kinds import RunKind, StepEvent
from agentruns.domain.backoff import Backoff
from agentruns.domain.failures import ProviderError
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import RunOutcome, TerminationReason


async def test_a_host_kind_runs_to_completion_in_memory() -> None:
    """A host's kind, drained by the harness, completes with the events its steps yielded."""

    async def summarise(run: AgentRun) -> AsyncIterator[StepEvent]:
        yield StepEvent("fetched", {"document": run.payload["document"]})
        yield StepEvent("summarised", {"words": 42})

    kind = RunKind(RunKindPolicy(name="summarise"), summarise)
    harness = agentruns.testing.harness(kind)

    run = await harness.runs.enqueue(
        "summarise", workspace="acme", subject="doc:1", payload={"document": "doc:1"}
    )
    report = await harness.drain()

    assert report.outcomes == {RunOutcome.COMPLETED: 1}
    assert (await harness.runs.get(run.id)).end_reason is TerminationReason.COMPLETED
    events = await harness.runs.events(run.id)
    assert [(event.type, event.data) for event in events] == [
        ("fetched", {"document": "doc:1"}),
        ("summarised", {"words": 42}),
    ]


async def test_a_503_is_retried_after_the_backoff_and_then_completes() -> None:
    """The first call answers 503; drain moves the clock past the backoff and the retry wins."""
    calls = 0

    async def flaky(run: AgentRun) -> AsyncIterator[StepEvent]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ProviderError("provider overloaded", status=503)
        yield StepEvent("answered", {"call": calls})

    backoff = Backoff(base=timedelta(seconds=30), jitter=0.0)
    kind = RunKind(RunKindPolicy(name="flaky", backoff=backoff), flaky)
    harness = agentruns.testing.harness(kind)
    started = harness.clock.now()

    run = await harness.runs.enqueue("flaky", workspace="acme", subject="doc:2")
    report = await harness.drain()

    assert report.outcomes == {RunOutcome.REQUEUED: 1, RunOutcome.COMPLETED: 1}
    done = await harness.runs.get(run.id)
    assert (done.end_reason, done.attempt, done.epoch) == (TerminationReason.COMPLETED, 1, 2)
    [answered] = await harness.runs.events(run.id)
    assert (answered.type, answered.data, answered.epoch) == ("answered", {"call": 2}, 2)
    assert answered.created_at == started + timedelta(seconds=30)


# -- end of the README example --

SECTION = "## Testing a host's run kind in memory"


def test_the_readme_shows_this_example_unchanged() -> None:
    """The README's snippet is this module's example, character for character."""
    from pathlib import Path

    source = Path(__file__).read_text(encoding="utf-8")
    example = source.split('"""\n\n', 1)[1].split("\n\n\n# -- end of the README example --")[0]
    readme = Path(__file__).resolve().parents[2] / "README.md"
    section = readme.read_text(encoding="utf-8").split(SECTION, 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert snippet == example + "\n"
