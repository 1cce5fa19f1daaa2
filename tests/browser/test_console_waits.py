"""A waiting run in a real browser (ADRs/0025): its page says what it waits for and until when,
the overview counts it, and the page's form delivers the signal that resumes it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from uuid import UUID

from selenium import webdriver
from selenium.webdriver.common.by import By

import agentruns
from agentruns import TerminationReason
from tests.browser.conftest import Stack
from tests.browser.test_console import shot, shown, text, wait_for


async def _until_waiting(client: agentruns.AgentRunsClient, run_id: UUID) -> agentruns.AgentRun:
    for _ in range(300):
        found = await client.runs.get(run_id)
        if found.waiting_until is not None:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError("the run did not start to wait")


async def test_a_signal_delivered_from_the_run_page_resumes_the_waiting_run(
    stack: Stack,
    client: agentruns.AgentRunsClient,
    browser: webdriver.Chrome,
    artifacts: Path,
) -> None:
    run = await client.runs.enqueue("approve", workspace="acme", subject="approval:1")
    waiting = await _until_waiting(client, run.id)
    assert waiting.waiting_for == "approval"

    browser.get(f"{stack.url}/")
    wait_for(lambda: (shown(browser, "#total-waiting") or "") == "1")
    assert "approval" in text(browser, "#waiting")

    browser.get(f"{stack.url}/runs/{run.id}")
    assert "for signal approval since " in text(browser, "#waiting")
    assert " until " in text(browser, "#waiting")
    assert browser.find_element(By.ID, "cancel-run")
    name = browser.find_element(By.ID, "signal-name")
    assert name.get_attribute("value") == "approval"
    browser.find_element(By.ID, "signal-payload").send_keys('{"approved_by": "ops"}')
    browser.find_element(By.ID, "signal-id").send_keys("ticket-7")
    shot(browser, artifacts, "run-waiting")
    browser.find_element(By.ID, "deliver-signal").click()
    wait_for(lambda: "signal was delivered" in (shown(browser, "#notice") or ""))
    assert text(browser, "#waiting") == "-"

    async def ended() -> agentruns.AgentRun | None:
        for _ in range(300):
            found = await client.runs.get(run.id)
            if found.end_reason is not None:
                return found
            await asyncio.sleep(0.1)
        return None

    done = await ended()
    assert done is not None
    assert done.end_reason is TerminationReason.COMPLETED
    [signal] = await client.runs.signals(run.id)
    assert (signal.signal_id, signal.payload) == ("ticket-7", {"approved_by": "ops"})
    browser.get(f"{stack.url}/runs/{run.id}")
    wait_for(lambda: "completed" in (shown(browser, "#run-state") or ""))
    assert not browser.find_elements(By.ID, "signal-form")
    shot(browser, artifacts, "run-signalled")
