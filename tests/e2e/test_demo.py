"""The demo, small: its invariant check passes on PostgreSQL with worker processes and in
memory, and fails when an invariant does not hold."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentruns.app.stats import RunStatus
from agentruns.domain.bands import Band
from agentruns.entrypoints.cli import app
from agentruns.entrypoints.demo.report import DemoReport, check_invariants
from agentruns.entrypoints.demo.runner import DemoConfig
from agentruns.entrypoints.demo.session import demo_in_memory, demo_on_postgres
from agentruns.entrypoints.demo.workload import HELD, INACTIVE, build_workload

SMALL = DemoConfig(scale=0.1, workers=2, concurrency=4, timeout=90)


def _assert_held(report: DemoReport) -> None:
    failed = [f"{check.name}: {check.detail}" for check in report.checks if not check.passed]
    assert failed == []
    assert report.final.total() == report.enqueued
    # Every deliberate zombie write of the killed worker's runs was refused.
    assert report.zombie_refused == 3 * len(report.orphans)
    assert report.zombie_accepted == 0


def test_the_workload_mixes_bands_faults_and_unavailable_workspaces() -> None:
    workload = build_workload(scale=0.1)
    assert {run.band for run in workload.runs} == set(Band)
    workspaces = Counter(run.workspace for run in workload.runs)
    assert {INACTIVE, HELD} <= workspaces.keys()
    assert len(workspaces) >= 6
    assert {"503", "429", "401", "chain", "stall past the lease"} <= workload.faults().keys()
    assert any(run.deadline_after for run in workload.runs)
    assert build_workload(scale=0.1) == workload  # seeded: the same runs every time


async def test_the_demo_in_memory_keeps_every_invariant() -> None:
    report = await demo_in_memory(SMALL)
    _assert_held(report)


def test_the_demo_on_postgres_with_worker_processes_keeps_every_invariant(
    postgres_server: str, tmp_path: Path
) -> None:
    report, url = demo_on_postgres(SMALL, postgres_server, tmp_path)
    _assert_held(report)
    assert url.endswith("/agentruns_demo") or "agentruns_demo" in url
    assert sorted(path.name for path in tmp_path.glob("*.log")) == [
        "demo-reaper-1.log",
        "demo-reaper-2.log",
        "demo-worker-1.log",
        "demo-worker-2.log",
    ]


def test_the_demo_command_prints_the_summary_and_exits_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["demo", "--memory", "--scale", "0.1", "--workers", "2"])
    assert result.exit_code == 0, result.output
    for fragment in ("Summary", "Fairness", "Invariants", "every invariant held"):
        assert fragment in result.stdout


def test_a_broken_invariant_fails_the_check() -> None:
    status = RunStatus(
        now=datetime(2026, 1, 1, tzinfo=UTC),
        counts=(),
        expired_leases=0,
        oldest_due_at=None,
        holds=(),
        inactive=(),
    )
    healthy = DemoReport(
        enqueued=0,
        offered=0,
        final=status,
        outcomes=Counter(),
        taken_back=0,
        taken_back_requeued=0,
        overdue_ended=0,
        killed=None,
        orphans=[],
        zombie_refused=0,
        zombie_accepted=0,
        samples=1,
        doubly_leased=set(),
        leased_share={},
        contended_share={},
        run_share={},
        elapsed=1.0,
        settled=True,
        lease=timedelta(seconds=2),
    )
    assert all(check.passed for check in check_invariants(healthy, unsettled=0))
    for broken, unsettled in (
        (replace(healthy, zombie_accepted=1), 0),
        (replace(healthy, doubly_leased={"acme/review-1"}), 0),
        (healthy, 1),
        (replace(healthy, enqueued=1), 0),
        (replace(healthy, settled=False), 0),
    ):
        broken.checks = check_invariants(broken, unsettled=unsettled)
        assert not broken.ok
