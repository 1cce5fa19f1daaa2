"""``agentruns gateway`` and ``agentruns reaper --sandboxes`` as real processes on PostgreSQL.

The host's sandboxes come from ``tests.e2e.sandbox_host``; this test process creates each
sandbox (its row in the shared database, its claim in its own memory cluster) and calls the
gateway process with the token that claim carries, as the sandbox would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from dependency_injector import providers

from agentruns.adapters.memory import MemorySandboxClaims
from agentruns.app.runs import AgentRuns
from agentruns.domain.sandbox import AgentSandbox
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.container import AgentRunsContainer
from agentruns.entrypoints.demo.kinds import demo_kinds
from tests.e2e import sandbox_host
from tests.e2e.test_cli import (
    KINDS,
    assert_one_line_error,
    enqueue,
    get,
    invoke,
    wait_until,
    with_runs,
)

SANDBOXES = "tests.e2e.sandbox_host:HOSTING"
# Nothing answers here: a reference is checked before any database is opened.
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nothing"


def command(
    url: str, log: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``agentruns ARGS`` as its own process on ``url``, its output (JSON log lines) in ``log``."""
    environment = {**os.environ, "AGENTRUNS_DATABASE_URL": url, **(env or {})}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agentruns.entrypoints.cli", "--log-format", "json", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environment,
        )


async def _ensure(url: str, subject: str) -> tuple[AgentSandbox, str]:
    """A new sandbox for ``subject`` and the token its claim carries."""
    hosting = sandbox_host.hosting()
    built = AgentRunsContainer()
    built.kinds.override(providers.Object(demo_kinds()))
    composition.use_postgres(built, url)
    composition.use_sandboxes(built, hosting, gateway_url="http://gateway.test:8081")
    try:
        sandbox = await built.sandboxes().ensure("reviewer", workspace="acme", subject=subject)
    finally:
        await composition.close(built)
    assert isinstance(hosting.claims, MemorySandboxClaims)
    body = hosting.claims.body(sandbox.claim_name)
    assert body is not None
    spec = body["spec"]
    assert isinstance(spec, dict)
    env = spec["env"]
    assert isinstance(env, list)
    [token] = [
        item["value"]
        for item in env
        if isinstance(item, dict) and item["name"] == "AGENTRUNS_SANDBOX_TOKEN"
    ]
    return sandbox, str(token)


def ensure(url: str, subject: str) -> tuple[AgentSandbox, str]:
    return asyncio.run(_ensure(url, subject))


def sandbox_row(url: str, sandbox: AgentSandbox) -> AgentSandbox | None:
    async def read() -> AgentSandbox | None:
        built = AgentRunsContainer()
        composition.use_postgres(built, url)
        composition.use_sandboxes(built, sandbox_host.hosting())
        try:
            return await built.sandboxes().get(sandbox.id)
        finally:
            await composition.close(built)

    return asyncio.run(read())


def started_url(log: Path, process: subprocess.Popen[bytes]) -> str:
    """The URL in the gateway's ``gateway started`` line, once it is logged."""
    found: list[str] = []

    def logged() -> bool:
        assert process.poll() is None, log.read_text()
        for line in log.read_text().splitlines():
            if '"gateway started"' in line and line.endswith("}"):  # a whole line, not half
                found.append(json.loads(line)["url"])
        return bool(found)

    wait_until(logged, "the gateway started")
    return found[0]


Gateway = tuple[str, subprocess.Popen[bytes], Path]


@pytest.fixture
def gateway(postgres_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """A gateway process on a free port, stopped with SIGTERM if the test has not stopped it."""
    log = tmp_path / "gateway.log"
    process = command(
        postgres_url, log, "gateway", "--kinds", KINDS, "--sandboxes", SANDBOXES, "--port", "0"
    )
    try:
        yield started_url(log, process), process, log
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


def test_the_gateway_serves_sandboxes_and_stops_gracefully_on_sigterm(
    postgres_url: str, gateway: Gateway
) -> None:
    url, process, log = gateway
    with httpx.Client(base_url=url, timeout=30) as anonymous:
        assert anonymous.post("/internal/agent/next").status_code == 401
        forged = {"Authorization": "Bearer not.a.token"}
        assert anonymous.post("/internal/agent/next", headers=forged).status_code == 401

    sandbox, token = ensure(postgres_url, "review:0")
    with httpx.Client(
        base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"}
    ) as http:
        assert http.post("/internal/agent/next").status_code == 204
        [run] = enqueue(postgres_url, 1)
        leased = http.post("/internal/agent/next")
        assert leased.status_code == 200, leased.text
        lease = leased.json()
        assert lease["run"]["id"] == str(run.id)
        ended = http.post(
            f"/internal/agent/runs/{run.id}/end",
            json={"epoch": lease["fence"]["epoch"], "reason": "completed"},
        )
        assert ended.status_code == 200, ended.text

    assert get(postgres_url, run.id).end_reason is TerminationReason.COMPLETED
    # The gateway is a live holder, with the run kinds its sandboxes claim.
    [holder] = json.loads(invoke(postgres_url, "status", "--json").stdout)["holders"]
    assert (holder["process"], holder["kinds"], holder["live"]) == (
        "agentruns-gateway",
        [sandbox_host.REVIEW],
        True,
    )
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    assert process.returncode == 0, log.read_text()
    assert '"msg": "gateway stopped"' in log.read_text()
    [stopped] = json.loads(invoke(postgres_url, "status", "--json").stdout)["holders"]
    assert (stopped["live"], stopped["stopped_at"] is not None) == (False, True)
    row = sandbox_row(postgres_url, sandbox)
    assert row is not None
    assert row.state.value == "ready"


def test_a_reaper_with_sandboxes_takes_back_runs_and_sandboxes(
    postgres_url: str, tmp_path: Path
) -> None:
    [run] = enqueue(postgres_url, 1)

    async def abandon(runs: AgentRuns) -> None:
        await runs.claim("a-worker-that-died")

    with_runs(postgres_url, abandon)
    sandbox, _ = ensure(postgres_url, "review:1")  # it never calls the gateway
    log = tmp_path / "reaper.log"
    reaper = command(
        postgres_url,
        log,
        "reaper",
        "--kinds",
        KINDS,
        "--sandboxes",
        SANDBOXES,
        "--every",
        "0.2",
        env={"AGENTRUNS_SANDBOX_START": "0s"},
    )
    try:
        wait_until(lambda: sandbox_row(postgres_url, sandbox) is None, "the sandbox reaped")
        wait_until(
            lambda: get(postgres_url, run.id).state is AgentRunState.QUEUED,
            "the lease taken back",
        )
    finally:
        reaper.send_signal(signal.SIGTERM)
        reaper.wait(timeout=60)
    assert reaper.returncode == 0, log.read_text()
    text = log.read_text()
    assert '"sandboxes": true' in text
    assert '"msg": "sandbox taken back"' in text
    assert f'"sandbox_id": "{sandbox.id}"' in text


@pytest.mark.parametrize("command", ["gateway", "reaper"])
@pytest.mark.parametrize(
    ("reference", "fragment"),
    [
        ("nocolon", "module:object"),
        ("no_such_module_anywhere:HOSTING", "cannot import"),
        ("tests.e2e.sandbox_host:MISSING", "has no 'MISSING'"),
        ("tests.e2e.sandbox_host:NOT_HOSTING", "is not a SandboxHosting"),
        ("tests.e2e.sandbox_host:DRIVES_UNKNOWN", "which --kinds does not register"),
    ],
)
def test_a_bad_sandboxes_reference_is_one_line(command: str, reference: str, fragment: str) -> None:
    result = invoke(UNREACHABLE, command, "--kinds", KINDS, "--sandboxes", reference)
    assert_one_line_error(result, fragment)


def test_the_gateway_needs_sandboxes() -> None:
    assert_one_line_error(invoke(UNREACHABLE, "gateway", "--kinds", KINDS), "--sandboxes")


def test_a_bad_sandboxes_reference_stops_the_process_with_one_line(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    process = command(
        UNREACHABLE, log, "gateway", "--kinds", KINDS, "--sandboxes", "no_such_module:HOSTING"
    )
    assert process.wait(timeout=60) == 1
    lines = log.read_text().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("agentruns: error: cannot import 'no_such_module'")


def test_a_port_in_use_is_one_line(postgres_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke(
            postgres_url,
            "gateway",
            "--kinds",
            KINDS,
            "--sandboxes",
            SANDBOXES,
            "--port",
            str(port),
        )
    assert_one_line_error(result, f"cannot serve the gateway on 127.0.0.1:{port}")
