"""``agentruns schedules`` and the scheduler inside real ``reaper`` processes, on PostgreSQL and
the real clock: one run per tick from three replicas, one of them killed along the way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import psycopg

from tests.e2e.test_cli import assert_one_line_error, invoke, wait_until

HOST = "tests.e2e.schedule_host:KINDS"


def _reaper(url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "AGENTRUNS_DATABASE_URL": url,
        "AGENTRUNS_SCHEDULER": "reaper",
        "AGENTRUNS_SCHEDULER_INTERVAL": "1s",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentruns.entrypoints.cli",
                "--log-format",
                "json",
                "reaper",
                "--kinds",
                HOST,
                "--every",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def _heartbeats(url: str) -> list[tuple[datetime, int]]:
    """Each claimed heartbeat tick and how many runs are due at it."""
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            """
            SELECT t.tick_at, (SELECT count(*) FROM agent_run r
                               WHERE r.kind = 'heartbeat' AND r.due_at = t.tick_at)
            FROM agent_schedule_tick t WHERE t.schedule = 'heartbeat' ORDER BY t.tick_at
            """
        ).fetchall()
    return [(tick_at, int(count)) for tick_at, count in rows]  # type: ignore[call-overload]


def test_three_reaper_replicas_enqueue_one_run_per_tick_on_the_real_clock(
    postgres_url: str, tmp_path: Path
) -> None:
    """Every second for a few seconds, one replica SIGKILLed half-way: the ticks run without a
    gap from the first to the last, each with exactly one run."""
    replicas = [_reaper(postgres_url, tmp_path / f"reaper-{n}.log") for n in range(3)]
    try:
        wait_until(lambda: len(_heartbeats(postgres_url)) >= 3, "three heartbeat ticks")
        replicas[0].send_signal(signal.SIGKILL)
        replicas[0].wait(timeout=30)
        seen = len(_heartbeats(postgres_url))
        wait_until(lambda: len(_heartbeats(postgres_url)) >= seen + 4, "four more ticks")
    finally:
        for process in replicas[1:]:
            process.send_signal(signal.SIGTERM)
        for process in replicas[1:]:
            process.wait(timeout=60)
    for n, process in enumerate(replicas[1:], start=1):
        assert process.returncode == 0, (tmp_path / f"reaper-{n}.log").read_text()
    ticks = _heartbeats(postgres_url)
    assert [count for _, count in ticks] == [1] * len(ticks)
    moments = [tick_at for tick_at, _ in ticks]
    assert moments == [moments[0] + timedelta(seconds=n) for n in range(len(moments))]
    logs = "".join((tmp_path / f"reaper-{n}.log").read_text() for n in range(3))
    assert logs.count('"msg": "schedule tick enqueued"') >= len(ticks)


def test_schedules_sync_list_pause_and_resume(postgres_url: str) -> None:
    empty = invoke(postgres_url, "schedules", "list")
    assert empty.exit_code == 0, empty.output
    assert "no schedules" in empty.stdout

    synced = invoke(postgres_url, "schedules", "sync", "--kinds", HOST)
    assert synced.exit_code == 0, synced.output
    assert "schedule daily-digest added" in synced.stdout
    assert "2 added, 0 changed, 0 removed, 0 unchanged" in synced.stdout
    # A process that only registers the digest kind leaves the heartbeat alone.
    again = invoke(
        postgres_url, "schedules", "sync", "--kinds", "tests.e2e.schedule_host:DIGEST_ONLY"
    )
    assert "0 added, 0 changed, 0 removed, 1 unchanged" in again.stdout

    listed = invoke(postgres_url, "schedules", "list")
    assert listed.exit_code == 0, listed.output
    for fragment in ("daily-digest", "cron 0 7 * * * (Europe/Paris)", "every 1s", "active"):
        assert fragment in listed.stdout

    paused = invoke(postgres_url, "schedules", "pause", "daily-digest")
    assert paused.exit_code == 0, paused.output
    fields = {
        row["name"]: row
        for row in json.loads(invoke(postgres_url, "schedules", "list", "--json").stdout)
    }
    assert fields["daily-digest"]["status"] == "paused"
    assert fields["heartbeat"]["status"] == "active"
    assert fields["heartbeat"]["last_tick"] is None
    assert fields["daily-digest"]["changed_at"] > fields["daily-digest"]["added_at"]
    assert fields["heartbeat"]["changed_at"] == fields["heartbeat"]["added_at"]

    resumed = invoke(postgres_url, "schedules", "resume", "daily-digest")
    assert resumed.exit_code == 0, resumed.output
    assert "resumed; next tick" in resumed.stdout
    assert "07:00:00+0" in resumed.stdout  # 07:00 in Paris, whatever the season

    assert_one_line_error(invoke(postgres_url, "schedules", "pause", "nope"), "no schedule 'nope'")


def test_the_list_shows_the_last_tick_and_its_run(postgres_url: str, tmp_path: Path) -> None:
    reaper = _reaper(postgres_url, tmp_path / "reaper.log")
    try:
        wait_until(lambda: len(_heartbeats(postgres_url)) >= 1, "a heartbeat tick")
    finally:
        reaper.send_signal(signal.SIGTERM)
        reaper.wait(timeout=60)
    fields = {
        row["name"]: row
        for row in json.loads(invoke(postgres_url, "schedules", "list", "--json").stdout)
    }
    heartbeat = fields["heartbeat"]
    assert heartbeat["last_tick"] is not None
    assert heartbeat["last_run_state"] == "queued"
    listed = invoke(postgres_url, "schedules", "list")
    assert f"last run   {heartbeat['last_run']} (queued)" in listed.stdout
