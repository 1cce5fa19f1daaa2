"""The ``agentruns`` commands against a real PostgreSQL (the embedded one unless a URL is given).

Errors an operator can fix end in one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
from typer.testing import CliRunner, Result

from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.ports import BudgetHold
from agentruns.app.runs import AgentRuns
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from agentruns.entrypoints.cli import app
from agentruns.entrypoints.demo.kinds import REVIEW, demo_kinds, scripted_steps
from examples.review import PostgresReviewJobs, ReviewRunKind
from tests.postgres_server import empty_database

KINDS = "agentruns.entrypoints.demo.kinds:KINDS"


def invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"AGENTRUNS_DATABASE_URL": url})


def assert_one_line_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("agentruns: error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


async def _with_runs(url: str, action: object) -> object:
    stores = make_postgres_stores(url)
    try:
        runs = AgentRuns(stores, demo_kinds(), random.Random(1))
        return await action(runs)  # type: ignore[operator]
    finally:
        await close_postgres_stores(stores)


def with_runs(url: str, action: object) -> object:
    return asyncio.run(_with_runs(url, action))


def enqueue(url: str, count: int, **changes: object) -> list[AgentRun]:
    async def action(runs: AgentRuns) -> list[AgentRun]:
        return [
            await runs.enqueue(
                REVIEW,
                workspace=str(changes.get("workspace", "acme")),
                subject=f"review:{number}",
                payload={"steps": 1, "step_ms": 1},
            )
            for number in range(count)
        ]

    result = with_runs(url, action)
    assert isinstance(result, list)
    return result


def get(url: str, run_id: UUID) -> AgentRun:
    async def action(runs: AgentRuns) -> AgentRun:
        return await runs.get(run_id)

    result = with_runs(url, action)
    assert isinstance(result, AgentRun)
    return result


def wait_until(condition: object, what: str, limit: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail (not time) the test if it never does."""
    give_up = time.monotonic() + limit
    while not condition():  # type: ignore[operator]
        if time.monotonic() > give_up:
            pytest.fail(f"never saw: {what}")
        time.sleep(0.1)


@pytest.fixture
def unmigrated_url(postgres_server: str) -> Iterator[str]:
    with empty_database(postgres_server) as url:
        yield url


def test_db_current_names_the_newest_revision_of_a_migrated_database(postgres_url: str) -> None:
    result = invoke(postgres_url, "db", "current")
    assert result.exit_code == 0, result.output
    assert "(newest)" in result.stdout


def test_an_unmigrated_database_gets_one_line_that_says_to_upgrade(unmigrated_url: str) -> None:
    assert_one_line_error(invoke(unmigrated_url, "status"), "agentruns db upgrade")
    assert_one_line_error(invoke(unmigrated_url, "db", "current"), "agentruns db upgrade")


def test_db_upgrade_migrates_an_empty_database(unmigrated_url: str) -> None:
    upgraded = invoke(unmigrated_url, "db", "upgrade")
    assert upgraded.exit_code == 0, upgraded.output
    assert invoke(unmigrated_url, "db", "current").exit_code == 0
    assert invoke(unmigrated_url, "status").exit_code == 0


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("mysql://root@localhost/agentruns", "not a postgresql:// URL"),
        ("this is not a url", "cannot be parsed"),
        ("postgresql://nobody@127.0.0.1:1/nothing", "cannot reach PostgreSQL at 127.0.0.1:1"),
    ],
)
def test_a_wrong_or_unreachable_url_gets_one_clear_line(url: str, fragment: str) -> None:
    for command in (["status"], ["db", "current"], ["db", "upgrade"]):
        assert_one_line_error(invoke(url, *command), fragment)


def test_status_shows_runs_by_state_workspace_and_holds(postgres_url: str) -> None:
    enqueue(postgres_url, 3)

    with_runs(postgres_url, _hold_and_deactivate)
    result = invoke(postgres_url, "status")
    assert result.exit_code == 0, result.output
    for fragment in ("acme", "overdrawn", "budget held until", "dormant", "inactive"):
        assert fragment in result.stdout
    assert "oldest due run has waited" in result.stdout

    as_json = invoke(postgres_url, "status", "--json")
    assert as_json.exit_code == 0, as_json.output
    fields = json.loads(as_json.stdout)
    assert sum(row["count"] for row in fields["runs"]) == 3
    assert fields["inactive_workspaces"] == ["dormant"]
    assert [hold["workspace"] for hold in fields["budget_holds"]] == ["overdrawn"]


def test_status_shows_holders_quiet_leases_and_kinds_no_live_holder_claims(
    postgres_url: str,
) -> None:
    """Runs of a kind no live holder claims are named; a lease nobody renews within three
    renewals is quiet; a drained worker shows as a stopped holder, with its process name."""
    enqueue(postgres_url, 2)

    async def ghost(runs: AgentRuns) -> list[AgentRun]:
        return await runs.claim("ghost", limit=1)  # a holder that writes no row, and dies

    [held] = with_runs(postgres_url, ghost)  # type: ignore[misc]
    time.sleep(0.5)
    quick = {
        "AGENTRUNS_DATABASE_URL": postgres_url,
        "AGENTRUNS_LEASE_RENEWAL": "100ms",
        "COLUMNS": "250",
    }
    before = CliRunner().invoke(app, ["status", "--json"], env=quick)
    assert before.exit_code == 0, before.output
    fields = json.loads(before.stdout)
    assert fields["holders"] == []
    [quiet] = fields["quiet_leases"]
    assert (quiet["run_id"], quiet["holder"], quiet["why"]) == (
        str(held.id),
        "ghost",
        "not_renewed",
    )
    assert fields["unclaimed_kinds"] == [{"kind": REVIEW, "queued": 1}]

    drained = CliRunner().invoke(app, ["worker", "--kinds", KINDS, "--drain"], env=quick)
    assert drained.exit_code == 0, drained.output
    after = CliRunner().invoke(app, ["status"], env=quick)
    assert after.exit_code == 0, after.output
    for fragment in ("Holders", "agentruns-worker", "stopped", "Quiet leases", "ghost"):
        assert fragment in after.stdout
    assert "queued runs of kinds no live holder claims: none" in after.stdout
    [worker] = json.loads(CliRunner().invoke(app, ["status", "--json"], env=quick).stdout)[
        "holders"
    ]
    assert (worker["process"], worker["live"], worker["kinds"]) == (
        "agentruns-worker",
        False,
        sorted(demo_kinds().names()),
    )
    assert worker["stopped_at"] is not None


async def _hold_and_deactivate(runs: AgentRuns) -> None:
    async with runs.transaction() as tx:
        now = await runs.stores.runs.now(tx)
    await runs.hold_budget(BudgetHold("overdrawn", until=now.replace(year=now.year + 1)))
    await runs.set_workspace_active("dormant", False)


def test_runs_show_prints_the_run_its_epochs_and_events(postgres_url: str) -> None:
    [run] = enqueue(postgres_url, 1)

    async def work(runs: AgentRuns) -> None:
        [claimed] = await runs.claim("cli-test")
        await runs.append_event(claimed.fence, "step", {"index": 0})
        await runs.end(claimed.fence, TerminationReason.COMPLETED)

    with_runs(postgres_url, work)
    result = invoke(postgres_url, "runs", "show", str(run.id))
    assert result.exit_code == 0, result.output
    assert str(run.id) in result.stdout
    assert "completed" in result.stdout
    assert "Epochs" in result.stdout
    assert '{"index": 0}' in result.stdout


def test_runs_show_of_an_unknown_or_malformed_id_is_one_line(postgres_url: str) -> None:
    assert_one_line_error(invoke(postgres_url, "runs", "show", "not-a-uuid"), "not a run id")
    missing = "00000000-0000-0000-0000-000000000000"
    assert_one_line_error(invoke(postgres_url, "runs", "show", missing), "no run")


def test_runs_show_takes_a_unique_id_prefix_and_names_the_matches_of_an_ambiguous_one(
    postgres_url: str,
) -> None:
    runs = enqueue(postgres_url, 40)
    run = runs[0]
    for prefix in (str(run.id)[:8], str(run.id)[:-4], str(run.id)[:13].upper()):
        result = invoke(postgres_url, "runs", "show", prefix)
        assert result.exit_code == 0, result.output
        assert str(run.id) in result.stdout
    # 40 ids over 16 first digits: some digit starts at least three of them.
    by_digit: dict[str, list[str]] = {}
    for one in runs:
        by_digit.setdefault(str(one.id)[0], []).append(str(one.id))
    digit, shared = max(by_digit.items(), key=lambda item: len(item[1]))
    result = invoke(postgres_url, "runs", "show", digit)
    assert_one_line_error(result, f"{digit} is the start of several run ids", "give more digits")
    assert sum(one in result.stderr for one in shared) == min(len(shared), 5)
    assert_one_line_error(invoke(postgres_url, "runs", "show", "b42e22zz"), "not a run id")


def test_runs_cancel_ends_a_queued_run_and_refuses_an_ended_one(postgres_url: str) -> None:
    [run] = enqueue(postgres_url, 1)
    cancelled = invoke(postgres_url, "runs", "cancel", str(run.id), "--kinds", KINDS)
    assert cancelled.exit_code == 0, cancelled.output
    assert get(postgres_url, run.id).end_reason is TerminationReason.CANCELLED
    again = invoke(postgres_url, "runs", "cancel", str(run.id), "--kinds", KINDS)
    assert_one_line_error(again, "already ended")


def test_runs_cancel_needs_no_kinds_for_a_kind_without_a_domain_row(postgres_url: str) -> None:
    [run] = enqueue(postgres_url, 1)
    cancelled = invoke(postgres_url, "runs", "cancel", str(run.id))
    assert cancelled.exit_code == 0, cancelled.output
    assert get(postgres_url, run.id).end_reason is TerminationReason.CANCELLED


def test_runs_cancel_needs_the_kinds_of_a_kind_with_a_domain_row(postgres_url: str) -> None:
    """Only its handler can move its row: without it, one line naming --kinds, nothing ended."""

    async def action(runs: AgentRuns) -> AgentRun:
        review = RunKinds(
            [RunKind(RunKindPolicy("review"), scripted_steps, ReviewRunKind(PostgresReviewJobs()))]
        )
        host = AgentRuns(runs.stores, review, random.Random(1))
        return await host.enqueue("review", workspace="acme", subject="pr:1")

    run = with_runs(postgres_url, action)
    assert isinstance(run, AgentRun)
    assert_one_line_error(invoke(postgres_url, "runs", "cancel", str(run.id)), "--kinds")
    assert get(postgres_url, run.id).state is AgentRunState.QUEUED


def test_purge_deletes_ended_runs_past_the_retention(postgres_url: str) -> None:
    [kept, gone] = enqueue(postgres_url, 2)
    assert invoke(postgres_url, "runs", "cancel", str(gone.id), "--kinds", KINDS).exit_code == 0
    assert "purged 0 runs" in invoke(postgres_url, "purge", "--older-than", "7d").stdout
    result = invoke(postgres_url, "purge", "--older-than", "0s")
    assert result.exit_code == 0, result.output
    assert "purged 1 runs" in result.stdout
    assert get(postgres_url, kept.id).state is AgentRunState.QUEUED


def test_a_bad_kinds_reference_is_one_line(postgres_url: str) -> None:
    assert_one_line_error(invoke(postgres_url, "worker", "--kinds", "no_such_module:KINDS"))
    assert_one_line_error(invoke(postgres_url, "worker", "--kinds", "nocolon"), "module:object")
    assert_one_line_error(invoke(postgres_url, "worker"), "--kinds")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body: bytes = response.read()
        return body.decode()


def _command(url: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "AGENTRUNS_DATABASE_URL": url, "AGENTRUNS_POLL_INTERVAL": "0.2"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agentruns.entrypoints.cli", "--log-format", "json", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def test_a_worker_process_runs_the_kinds_and_stops_gracefully_on_sigterm(
    postgres_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    port = _free_port()
    worker = _command(
        postgres_url,
        log,
        "worker",
        "--kinds",
        KINDS,
        "--concurrency",
        "2",
        "--metrics-port",
        str(port),
    )
    try:
        runs = enqueue(postgres_url, 3)
        wait_until(
            lambda: all(get(postgres_url, run.id).state is AgentRunState.ENDED for run in runs),
            "every run ended",
        )
        metrics = _scrape(port)
        assert "agentruns_claims_total 3.0" in metrics
        assert 'agentruns_ends_total{kind="agent.review",reason="completed"} 3.0' in metrics
        assert "agentruns_worker_runs_in_flight 0.0" in metrics
        assert "agentruns_worker_free_slots 2.0" in metrics  # --concurrency 2, all free
        assert "process_resident_memory_bytes" in metrics
        assert "_created" not in metrics
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert worker.returncode == 0, log.read_text()
    assert all(get(postgres_url, run.id).end_reason is TerminationReason.COMPLETED for run in runs)
    text = log.read_text()
    assert '"msg": "worker stopped"' in text
    assert '"completed": 3' in text
    assert '"in_flight": 0' in text.split('"worker draining')[1]  # said at the signal


def test_a_reaper_process_takes_back_an_abandoned_lease(postgres_url: str, tmp_path: Path) -> None:
    [run] = enqueue(postgres_url, 1)

    async def abandon(runs: AgentRuns) -> None:
        await runs.claim("a-worker-that-died")

    with_runs(postgres_url, abandon)
    log = tmp_path / "reaper.log"
    reaper = _command(postgres_url, log, "reaper", "--kinds", KINDS, "--every", "0.2")
    try:
        wait_until(
            lambda: get(postgres_url, run.id).state is AgentRunState.QUEUED,
            "the lease taken back",
        )
    finally:
        reaper.send_signal(signal.SIGINT)
        reaper.wait(timeout=60)
    assert reaper.returncode == 0, log.read_text()
    assert get(postgres_url, run.id).attempt == 1
    assert '"msg": "lease taken back"' in log.read_text()


def test_without_a_url_the_cli_starts_an_embedded_postgresql_and_says_where(
    private_dir: Path,
) -> None:
    data = private_dir / "pgdata"
    runner = CliRunner()
    env: dict[str, str | None] = {"AGENTRUNS_DATABASE_URL": None}
    upgraded = runner.invoke(app, ["db", "upgrade", "--data-dir", str(data)], env=env)
    assert upgraded.exit_code == 0, upgraded.output
    assert f"using the embedded PostgreSQL in {data}" in upgraded.stderr  # it created it
    current = runner.invoke(app, ["db", "current", "--data-dir", str(data)], env=env)
    assert current.exit_code == 0, current.output
    assert "(newest)" in current.stdout
    assert "AGENTRUNS_DATABASE_URL is not set" not in current.stderr  # not on every command
    told = runner.invoke(app, ["-v", "db", "current", "--data-dir", str(data)], env=env)
    assert told.exit_code == 0, told.output
    assert f"using the embedded PostgreSQL in {data}" in told.stderr
