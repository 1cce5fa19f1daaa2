"""The browser tier: the console served by `agentruns console` in its own process, with a real
worker and reaper, on the embedded PostgreSQL, driven by Debian's headless Chromium through its
chromium-driver (nothing is downloaded). Screenshots go to ``tests/browser/artifacts/``.

`make test` runs this tier only when /usr/bin/chromium and /usr/bin/chromedriver are present (CI
installs them); otherwise it prints the line that installs them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

import agentruns
from agentruns.testing import PostgresTestServer
from tests.browser.kinds import KINDS

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).parent / "artifacts"
KINDS_REF = "tests.browser.kinds:KINDS"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Process:
    popen: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def start(args: list[str], env: dict[str, str], log: Path) -> Process:
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "agentruns", "--log-format", "json", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Process(popen, log)


def console_url(process: Process, timeout: float = 60.0) -> str:
    """The URL `agentruns console` says it serves at."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"the console is at (http://\S+?)/?$", process.text(), re.M)
        if found:
            return found[1]
        if process.popen.poll() is not None:
            raise AssertionError(f"the console exited: {process.text()[-2000:]}")
        time.sleep(0.1)
    raise AssertionError(f"the console did not start: {process.text()[-2000:]}")


def environment(url: str, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGENTRUNS_")}
    env.update(
        AGENTRUNS_DATABASE_URL=url,
        AGENTRUNS_LEASE_RENEWAL="1s",  # the reaper's period: a lost lease comes back in seconds
        AGENTRUNS_POLL_INTERVAL="0.5s",
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


@dataclass
class Stack:
    """A database with a console, a worker and a reaper running on it."""

    database_url: str
    url: str
    worker: Process
    logs: Path


@pytest.fixture(scope="module")
def database_url(agentruns_server: PostgresTestServer) -> Iterator[str]:
    with agentruns_server.database() as url:
        yield url


@pytest.fixture(scope="module")
def stack(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("browser-logs")
    env = environment(database_url)
    processes = [
        start(["console", "--port", "0", "--kinds", KINDS_REF], env, logs / "console.log"),
        start(["worker", "--kinds", KINDS_REF, "--concurrency", "4"], env, logs / "worker.log"),
        start(["reaper", "--kinds", KINDS_REF], env, logs / "reaper.log"),
    ]
    try:
        url = console_url(processes[0])
        yield Stack(database_url, url, processes[1], logs)
    finally:
        for process in processes:
            process.stop()


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[agentruns.AgentRunsClient]:
    async with agentruns.connect(stack.database_url, kinds=KINDS) as made:
        yield made


@pytest.fixture(scope="session")
def browser() -> Iterator[webdriver.Chrome]:
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--no-first-run",
        "--window-size=1360,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
