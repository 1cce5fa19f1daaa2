"""A run's steps streaming live in a real browser (ADRs/0030): the run page appends each step
as its holder writes it, and after a reload resumes from the last one with none repeated."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from selenium import webdriver

import agentruns
from agentruns import TerminationReason
from tests.browser.conftest import Stack
from tests.browser.test_console import shot, shown, wait_for


async def _narrate(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    yield agentruns.StepEvent("said", {})  # never driven: the test holds the run itself


# A kind the stack's worker does not know, so the test holds the run and writes its steps.
NARRATE = agentruns.RunKind(agentruns.RunKindPolicy(name="narrate"), _narrate)


@pytest.fixture
async def holder(stack: Stack) -> AsyncIterator[agentruns.AgentRunsClient]:
    async with agentruns.connect(stack.database_url, kinds=agentruns.RunKinds([NARRATE])) as made:
        yield made


def _seqs(browser: webdriver.Chrome) -> list[str]:
    found = browser.execute_script(
        "return Array.from(document.querySelectorAll('#events tbody tr[data-seq]'))"
        ".map(function (row) { return row.getAttribute('data-seq'); });"
    )
    return [str(seq) for seq in found]


def _show_events(browser: webdriver.Chrome) -> None:
    browser.execute_script("document.getElementById('events').scrollIntoView();")


async def test_the_run_page_streams_steps_live_and_resumes_after_a_reload(
    stack: Stack,
    holder: agentruns.AgentRunsClient,
    browser: webdriver.Chrome,
    artifacts: Path,
) -> None:
    run = await holder.runs.enqueue("narrate", workspace="acme", subject="conversation:live")
    (leased,) = await holder.runs.claim("browser-holder", kinds=["narrate"])
    assert leased.id == run.id
    await holder.runs.step_boundary(leased.fence, "said", {"text": "hello"})

    browser.get(f"{stack.url}/runs/{run.id}")
    assert _seqs(browser) == ["1"]
    for n in (2, 3):
        await holder.runs.step_boundary(leased.fence, "said", {"text": f"part {n}"})
        wait_for(lambda n=n: _seqs(browser) == [str(s) for s in range(1, n + 1)], timeout=10)
    _show_events(browser)
    shot(browser, artifacts, "run-streaming")

    browser.refresh()
    wait_for(lambda: _seqs(browser) == ["1", "2", "3"], timeout=10)
    await holder.runs.step_boundary(leased.fence, "said", {"text": "after the reload"})
    wait_for(lambda: _seqs(browser) == ["1", "2", "3", "4"], timeout=10)
    await asyncio.sleep(0.5)  # no second copy of any step arrives late
    assert _seqs(browser) == ["1", "2", "3", "4"]

    await holder.runs.end(leased.fence, TerminationReason.COMPLETED, result={"said": 4})
    wait_for(lambda: "completed" in (shown(browser, "#run-state") or ""), timeout=10)
    assert _seqs(browser) == ["1", "2", "3", "4"]
    _show_events(browser)
    shot(browser, artifacts, "run-streamed")
