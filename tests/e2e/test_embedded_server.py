"""The embedded PostgreSQL is owned cleanly: whichever process starts it, a later command finds
and reuses or stops it; a SIGKILLed owner leaves nothing that keeps it running or blocks the next
start; ``agentruns db start`` keeps it up for other tools and ``agentruns db stop`` stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from agentruns.adapters.embedded import status

KINDS = "agentruns.entrypoints.demo.kinds:KINDS"


def agentruns(data: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "AGENTRUNS_DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "agentruns.entrypoints.cli", *args, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def handles(data: Path) -> list[int]:
    found = data / ".handle_pids.json"
    text = found.read_text().strip() if found.exists() else ""
    return json.loads(text) if text else []


def wait_for(condition: object, what: str, limit: float = 90.0) -> None:
    give_up = time.monotonic() + limit
    while not condition():  # type: ignore[operator]
        if time.monotonic() > give_up:
            pytest.fail(f"never saw: {what}")
        time.sleep(0.1)


@pytest.fixture
def data(private_dir: Path) -> Iterator[Path]:
    folder = private_dir / "pgdata"
    yield folder
    if status(folder).running:
        agentruns(folder, "db", "stop", "--force", check=False)


def test_a_sigkilled_owner_neither_keeps_the_server_nor_blocks_the_next_command(
    data: Path, tmp_path: Path
) -> None:
    agentruns(data, "db", "upgrade")
    assert not status(data).running  # the last command let go: stopped
    log = tmp_path / "worker.log"
    env = {key: value for key, value in os.environ.items() if key != "AGENTRUNS_DATABASE_URL"}
    with log.open("wb") as out:
        owner = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentruns.entrypoints.cli",
                "worker",
                "--kinds",
                KINDS,
                "--data-dir",
                str(data),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_for(lambda: b"worker started" in log.read_bytes(), "the worker started")
        assert owner.pid in handles(data)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    finally:
        if owner.poll() is None:
            owner.kill()
    assert owner.pid in handles(data)  # nobody let go for it
    assert status(data).running
    assert status(data).holders == ()  # a dead pid holds nothing

    # The next command joins the running server, and lets go of it as the last live holder.
    shown = agentruns(data, "status")
    assert shown.stdout.startswith("database: postgresql")
    assert not status(data).running
    assert handles(data) == []
    # And the one after starts it afresh.
    assert "(newest)" in agentruns(data, "db", "current").stdout


def test_db_start_keeps_the_server_for_other_tools_until_db_stop(data: Path) -> None:
    started = agentruns(data, "db", "start")
    url = started.stdout.strip()
    assert url.startswith("postgresql://")
    assert status(data).running
    assert status(data).kept
    assert agentruns(data, "db", "url").stdout.strip() == url
    assert agentruns(data, "db", "upgrade").returncode == 0
    assert status(data).running  # kept: the command that used it did not stop it
    with psycopg.connect(url) as connection:
        assert connection.execute("SELECT 1").fetchone() == (1,)
    stopped = agentruns(data, "db", "stop")
    assert "stopped the embedded PostgreSQL" in stopped.stdout
    assert not status(data).running
    again = agentruns(data, "db", "url", check=False)
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1
    assert "is not running" in again.stderr
    assert "was not running" in agentruns(data, "db", "stop").stdout


def test_db_stop_refuses_while_a_live_process_uses_the_server_unless_forced(
    data: Path, tmp_path: Path
) -> None:
    agentruns(data, "db", "upgrade")
    env = {key: value for key, value in os.environ.items() if key != "AGENTRUNS_DATABASE_URL"}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentruns.entrypoints.cli",
                "worker",
                "--kinds",
                KINDS,
                "--data-dir",
                str(data),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_for(lambda: b"worker started" in log.read_bytes(), "the worker started")
        refused = agentruns(data, "db", "stop", check=False)
        assert refused.returncode == 1
        assert f"in use by process(es) {worker.pid}" in refused.stderr
        assert status(data).running
        assert "stopped" in agentruns(data, "db", "stop", "--force").stdout
        assert not status(data).running
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
