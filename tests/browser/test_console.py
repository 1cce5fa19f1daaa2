"""The console in a real browser, on PostgreSQL, with a worker and a reaper running."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
from selenium import webdriver
from selenium.webdriver.common.by import By

import agentruns
from agentruns import AgentRunState, TerminationReason
from tests.browser.conftest import (
    KINDS_REF,
    Stack,
    console_url,
    environment,
    start,
)
from tests.browser.kinds import PROVIDER_KEY

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float = 30.0, every: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(every)


async def settle(client: agentruns.AgentRunsClient) -> None:
    """Until no run is queued or leased (a minute at most)."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        queued = await client.runs.list_runs(state="queued", limit=1)
        leased = await client.runs.list_runs(state="leased", limit=1)
        if not queued.runs and not leased.runs:
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the runs did not drain")


def shown(browser: webdriver.Chrome, selector: str) -> str | None:
    """An element's text, read in one script call, or None while no element matches.

    The overview swaps its fragments in place while it polls, so a handle found by one
    call can be gone by the next; a single script reads the element that is there now.
    A wait reads through this: while a submitted form's answer is loading, the page the
    browser shows is neither the old one nor the new one yet.
    """
    found = browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText.trim() : null;",
        selector,
    )
    return None if found is None else str(found)


def text(browser: webdriver.Chrome, selector: str) -> str:
    found = shown(browser, selector)
    if found is None:
        raise AssertionError(f"no element matches {selector}")
    return found


def shot(browser: webdriver.Chrome, artifacts: Path, name: str) -> None:
    path = artifacts / f"{name}.png"
    browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000


async def test_the_overview_counts_match_the_database_and_update_while_runs_drain(
    stack: Stack,
    client: agentruns.AgentRunsClient,
    browser: webdriver.Chrome,
    artifacts: Path,
) -> None:
    browser.get(stack.url + "/")
    assert text(browser, "#total-queued") == "0"
    for number in range(24):
        band = ("interactive", "batch", "background")[number % 3]
        await client.runs.enqueue(
            "drain", workspace=f"team-{number % 4}", subject=f"doc:{number}", band=band
        )
    # The page refreshes itself: the queue is seen, then seen to drain, with no reload.
    marker = browser.execute_script("window.__loaded_once = true; return 1")
    seen_busy = wait_for(
        lambda: int(text(browser, "#total-queued")) + int(text(browser, "#total-leased")) > 0
    )
    shot(browser, artifacts, "overview-draining")
    await settle(client)
    wait_for(
        lambda: text(browser, "#total-ended") == "24" and text(browser, "#total-leased") == "0"
    )
    assert seen_busy
    assert marker == 1
    assert browser.execute_script("return window.__loaded_once") is True  # never reloaded
    async with client.family.stores.scope.transaction() as tx:
        status = await client.family.stats.status(tx)
    assert status.total(AgentRunState.ENDED) == 24
    assert int(text(browser, "#total-queued")) == status.total(AgentRunState.QUEUED) == 0
    for band in ("interactive", "batch", "background"):
        ended = text(browser, f'#by-band tr[data-band="{band}"] [data-count="ended"]')
        assert int(ended) == 8
    assert browser.find_element(By.CSS_SELECTOR, "svg.chart polyline[data-series=completions]")
    shot(browser, artifacts, "overview")


async def test_a_run_page_shows_its_epochs_and_events_in_order(
    stack: Stack,
    client: agentruns.AgentRunsClient,
    browser: webdriver.Chrome,
    artifacts: Path,
) -> None:
    run = await client.runs.enqueue("flaky", workspace="acme", subject="pr:7")
    await settle(client)
    done = await client.runs.get(run.id)
    assert (done.end_reason, done.epoch) == (TerminationReason.COMPLETED, 2)

    browser.get(f"{stack.url}/runs/{run.id}")
    epochs = browser.find_elements(By.CSS_SELECTOR, "#timeline > li.epoch")
    assert [item.get_attribute("data-epoch") for item in epochs] == ["1", "2"]
    assert "failed" in epochs[0].text
    assert "ProviderError" in epochs[0].text
    assert "requeued with backoff" in epochs[0].text
    assert f"ended {TerminationReason.COMPLETED}" in epochs[1].text
    rows = browser.find_elements(By.CSS_SELECTOR, "#events tbody tr[data-seq]")
    shown = [(row.get_attribute("data-seq"), row.get_attribute("data-epoch")) for row in rows]
    assert shown == [("1", "1"), ("2", "2"), ("3", "2")]
    assert "server_error" in text(browser, "#failures")
    shot(browser, artifacts, "run")


async def test_a_run_page_redacts_its_event_and_labels_every_time_with_its_zone(
    stack: Stack,
    client: agentruns.AgentRunsClient,
    browser: webdriver.Chrome,
    artifacts: Path,
) -> None:
    run = await client.runs.enqueue(
        "keyed", workspace="acme", subject="pr:8", payload={"password": "hunter22", "lang": "en"}
    )
    await settle(client)
    browser.get(f"{stack.url}/runs/{run.id}")
    browser.execute_script(
        "document.querySelectorAll('#events details').forEach(d => d.open = true)"
    )
    page = text(browser, "main")
    assert PROVIDER_KEY not in page
    assert "hunter22" not in page
    assert '"api_key": "[redacted]"' in page
    assert '"model": "m-1"' in page
    times = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( UTC)?", page)
    assert times
    assert all(times), "every time on the page says its zone"
    shot(browser, artifacts, "run-redacted")


async def test_cancelling_a_leased_run_from_the_page_fences_its_holder_out(
    stack: Stack,
    client: agentruns.AgentRunsClient,
    browser: webdriver.Chrome,
    artifacts: Path,
) -> None:
    run = await client.runs.enqueue("long", workspace="acme", subject="chat:1")

    async def leased() -> agentruns.AgentRun | None:
        for _ in range(200):
            found = await client.runs.get(run.id)
            if found.state is AgentRunState.LEASED and len(await client.runs.events(run.id)) > 1:
                return found
            await asyncio.sleep(0.1)
        return None

    held = await leased()
    assert held is not None
    assert held.holder is not None
    browser.get(f"{stack.url}/runs/{run.id}")
    assert "leased" in text(browser, "#run-state")
    assert browser.find_element(By.ID, "lease-countdown")
    browser.find_element(By.ID, "cancel-run").click()
    assert held.holder in wait_for(lambda: shown(browser, "#confirm-form"))
    shot(browser, artifacts, "confirm")
    browser.find_element(By.ID, "confirm").click()
    wait_for(lambda: "cancelled" in (shown(browser, "#run-state") or ""))
    assert "holder's next renewal is refused" in text(browser, "#notice")
    cancelled = await client.runs.get(run.id)
    assert cancelled.end_reason is TerminationReason.CANCELLED

    # The worker holding it learns at its next step boundary: the renewal is refused (LeaseLost),
    # nothing more is appended, and it reports the run cancelled under its epoch.
    def lost() -> bool:
        for line in stack.worker.log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("run_id") == str(run.id) and entry.get("outcome") == "cancelled":
                return True
        return False

    wait_for(lost, timeout=20)
    events = await client.runs.events(run.id)
    await asyncio.sleep(1.5)
    assert len(await client.runs.events(run.id)) == len(events)
    assert all(event.created_at <= cancelled.ended_at for event in events)  # type: ignore[operator]


async def test_retrying_a_dead_letter_from_the_page_creates_its_continuation(
    stack: Stack,
    client: agentruns.AgentRunsClient,
    browser: webdriver.Chrome,
    artifacts: Path,
) -> None:
    run = await client.runs.enqueue("dead", workspace="globex", subject="ticket:3")
    await settle(client)
    assert (await client.runs.get(run.id)).end_reason is TerminationReason.NOT_RETRYABLE

    browser.get(f"{stack.url}/runs?reason=not_retryable&workspace=globex")
    browser.find_element(By.CSS_SELECTOR, f'tr[data-run="{run.id}"] a').click()
    assert "the API key was revoked" in wait_for(lambda: shown(browser, "#failures"))
    browser.find_element(By.ID, "retry-run").click()
    wait_for(lambda: shown(browser, "#confirm-form"))
    browser.find_element(By.ID, "confirm").click()
    wait_for(lambda: str(run.id) in (shown(browser, "#continues") or ""))
    later = await client.runs.continued_by(run.id)
    assert later is not None
    assert later.continues == run.id
    assert later.attempt == 1
    assert str(later.id) in browser.current_url
    await settle(client)


async def test_every_page_is_captured(
    stack: Stack,
    client: agentruns.AgentRunsClient,
    browser: webdriver.Chrome,
    artifacts: Path,
) -> None:
    await client.schedules.sync()
    await client.runs.hold_budget(
        agentruns.BudgetHold(
            "team-3",
            (
                await client.runs.get((await client.runs.list_runs(limit=1)).runs[0].id)
            ).enqueued_at.replace(year=2099),
        )
    )
    for page, name in (
        ("/workspaces?sort=leased&desc=1", "workspaces"),
        ("/runs", "runs"),
        ("/schedules", "schedules"),
        ("/sandboxes", "sandboxes"),
    ):
        browser.get(stack.url + page)
        assert "agentruns" in browser.title
        shot(browser, artifacts, name)
    browser.get(stack.url + "/workspaces")
    assert "budget held until" in text(browser, "#workspaces")
    browser.get(stack.url + "/schedules")
    assert "hourly-digest" in text(browser, "#schedules")
    assert "Europe/Paris (+0" in text(browser, 'tr[data-schedule="hourly-digest"]')


def test_on_a_network_address_only_a_client_with_the_credential_sees_data(
    database_url: str,
    tmp_path: Path,
    browser: webdriver.Chrome,
    artifacts: Path,
    stack: Stack,
) -> None:
    # Without a credential, anything but localhost is refused at once, with one line.
    refused = start(
        ["console", "--host", "0.0.0.0", "--port", "0"],
        environment(database_url),
        tmp_path / "refused.log",
    )
    assert refused.popen.wait(timeout=60) == 1
    [line] = [row for row in refused.text().splitlines() if row.strip()]
    assert line.startswith("agentruns: error: --host 0.0.0.0 is not this machine only")

    token = "browser-tier-token-0451"
    served = start(
        ["console", "--host", "0.0.0.0", "--port", "0", "--kinds", KINDS_REF],
        environment(database_url, AGENTRUNS_CONSOLE_TOKEN=token),
        tmp_path / "served.log",
    )
    try:
        url = console_url(served).replace("0.0.0.0", "127.0.0.1")
        for path in ("/", "/runs", "/live/overview", "/workspaces"):
            answer = httpx.get(url + path, timeout=10)
            assert answer.status_code == 401
            assert "acme" not in answer.text
            assert "doc:" not in answer.text
        assert httpx.get(url + "/runs", headers={"Authorization": f"Bearer {token}"}).is_success
        browser.delete_all_cookies()
        browser.get(url + "/runs")
        assert "acme" not in browser.page_source
        assert "Sign in" in browser.page_source
        browser.get(url + "/login")
        browser.find_element(By.NAME, "token").send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "form button").click()
        wait_for(lambda: browser.find_elements(By.ID, "total-queued"))
        browser.get(url + "/runs")
        assert "acme" in browser.page_source
    finally:
        served.stop()
