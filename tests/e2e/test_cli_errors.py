"""Every error an operator can make on the command line: one line on stderr, exit status 1, and
never a traceback. Bad ports, durations, times, URLs, import paths, payloads, bands, database
names, options and settings, walked one by one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner, Result

from agentruns.entrypoints.cli import app
from agentruns.testing import PostgresTestServer

KINDS = "agentruns.entrypoints.demo.kinds:KINDS"
REVIEW = "agent.review"
RUN = "00000000-0000-0000-0000-000000000000"


def invoke(url: str, *args: str, **env: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"AGENTRUNS_DATABASE_URL": url, **env})


def assert_one_line_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    # A bug escapes as its exception; an operator's error leaves as SystemExit(1).
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("agentruns: error: "), lines[0]
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def migrated_url(agentruns_server: PostgresTestServer) -> Iterator[str]:
    """One migrated database for the whole walk: a refused command writes nothing."""
    with agentruns_server.database() as url:
        yield url


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


ERRORS: list[tuple[list[str], str]] = [
    # ports
    (["worker", "--kinds", KINDS, "--metrics-port", "70000"], "is not a port"),
    (["reaper", "--kinds", KINDS, "--metrics-port", "-1"], "is not a port"),
    (["worker", "--kinds", KINDS, "--metrics-port", "nine"], "Invalid value for '--metrics-port'"),
    (["gateway", "--kinds", KINDS, "--sandboxes", "x:y", "--port", "99999"], "--port"),
    # durations and times
    (["purge", "--older-than", "999999999d"], "longer than 36500 days"),
    (["purge", "--older-than", "-1d"], "--older-than: '-1d' is not a duration"),
    (["purge", "--older-than", "soon"], "--older-than: 'soon' is not a duration"),
    (["reaper", "--kinds", KINDS, "--every", "often"], "--every"),
    (["reaper", "--kinds", KINDS, "--every", "0"], "above 0"),
    (["enqueue", REVIEW, "--kinds", KINDS, "--due", "someday"], "--due"),
    (["enqueue", REVIEW, "--kinds", KINDS, "--deadline", "2026-01-01T00:00:00"], "time zone"),
    # import paths
    (["worker", "--kinds", "nocolon"], "module:object"),
    (["worker", "--kinds", "no_such_module_anywhere:KINDS"], "cannot import"),
    (["worker", "--kinds", "agentruns.entrypoints.demo.kinds:NOPE"], "has no 'NOPE'"),
    (["worker", "--kinds", "agentruns.entrypoints.demo.kinds:LEASE"], "is not a RunKinds"),
    (["worker"], "no run kinds"),
    (["reaper", "--kinds", KINDS, "--sandboxes", "no_such_module_anywhere:X"], "cannot import"),
    # input
    (["enqueue", "agent.nothing", "--kinds", KINDS], "unknown run kind 'agent.nothing'"),
    (["enqueue", REVIEW, "--kinds", KINDS, "--payload", "{not json"], "--payload is not JSON"),
    (["enqueue", REVIEW, "--kinds", KINDS, "--payload", "[1, 2]"], "JSON object"),
    (["enqueue", REVIEW, "--kinds", KINDS, "--band", "urgent"], "unknown band 'urgent'"),
    # Found by issue 27: tracebacks, a callable called, an emoji, hidden or upper-case reasons.
    (
        ["enqueue", REVIEW, "--kinds", KINDS, "--payload", "[" * 100_000 + "]" * 100_000],
        "--payload is nested deeper than 64 levels",
    ),
    (
        ["enqueue", REVIEW, "--kinds", KINDS, "--due", "0001-01-01T00:00:00+05:00"],
        "--due: '0001-01-01T00:00:00+05:00' falls outside the years 1 to 9999 in UTC",
    ),
    (["enqueue", REVIEW, "--kinds", KINDS, "--due", "-5m"], "--due: '-5m' is negative"),
    (
        ["enqueue", REVIEW, "--kinds", KINDS, "--due", "99999999999d"],
        "--due: '99999999999d' is longer than 36500 days",
    ),
    (
        ["enqueue", REVIEW, "--kinds", KINDS, "--band", "urgent"],
        "expected one of interactive, batch, background",
    ),
    (["worker", "--kinds", "os:system"], "--kinds os:system is not a RunKinds"),
    (["worker", "--kinds", "os.path:join"], "is a function that needs arguments"),
    (["worker", "--kinds", "no_such_module_anywhere:x"], "--kinds no_such_module_anywhere:x:"),
    (["worker", "--kinds", KINDS, "--concurrency", "99999999999"], "from 1 to 10000 runs"),
    (["schedules", "list", "--database", "no_such_database"], "does not exist"),
    (["schedules", "pause", "nightly", "--database", "no_such_database"], "does not exist"),
    (["schedules", "resume", "nightly", "--database", "no_such_database"], "does not exist"),
    (["schedules", "sync", "--kinds", KINDS, "--database", "no_such_database"], "does not exist"),
    (
        [
            "gateway",
            "--kinds",
            KINDS,
            "--sandboxes",
            "tests.e2e.sandbox_host:HOSTING",
            "--database",
            "no_such_database",
        ],
        "does not exist",
    ),
    (["enqueue", REVIEW, "--kinds", KINDS, "--workspace", " "], "workspace"),
    (["worker", "--kinds", KINDS, "--concurrency", "0"], "from 1 to 10000 runs"),
    (["runs", "show", "not-a-uuid"], "not a run id"),
    (["runs", "list", "--state", "done"], "no state 'done': expected one of queued, leased, ended"),
    (["runs", "list", "--reason", "oops"], "no reason 'oops'"),
    (["runs", "list", "--limit", "0"], "a page holds 1 to 1000 runs"),
    (["runs", "list", "--cursor", "next"], "is not a cursor"),
    (["runs", "show", RUN], "no run"),
    (["runs", "cancel", RUN], "no run"),
    (["runs", "retry", RUN, "--kinds", KINDS], "no run"),
    (["runs", "retry", RUN], "no run kinds"),
    (["status", "--database", "Not-A-Name!"], "not a plain database name"),
    (["status", "--database", "no_such_database"], "does not exist"),
    # the parser's own errors
    (["status", "--no-such-option"], "No such option"),
    (["--log-format", "xml", "status"], "choose json or kv"),
    (["--log-level", "loud", "status"], "choose debug"),
    (["no-such-command"], "No such command"),
    (["db", "stop"], "AGENTRUNS_DATABASE_URL is set"),
]


@pytest.mark.parametrize(("args", "fragment"), ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_every_operator_error_is_one_line_and_exit_1(
    migrated_url: str, args: list[str], fragment: str
) -> None:
    assert_one_line_error(invoke(migrated_url, *args), fragment)


def test_a_metrics_port_in_use_is_one_line(migrated_url: str, busy_port: int) -> None:
    for command in ("worker", "reaper"):
        result = invoke(migrated_url, command, "--kinds", KINDS, "--metrics-port", str(busy_port))
        assert_one_line_error(result, f"cannot serve metrics on 127.0.0.1:{busy_port}", "in use")


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("mysql://root@localhost/agentruns", "not a postgresql:// URL"),
        ("this is not a url", "cannot be parsed"),
        ("postgresql://app@db:notaport/app", "cannot be parsed"),
        ("postgresql://nobody@127.0.0.1:1/nothing", "cannot reach PostgreSQL at 127.0.0.1:1"),
        ("postgres://nobody:s3cret@127.0.0.1:1/nothing", "cannot reach PostgreSQL at 127.0.0.1:1"),
    ],
)
def test_a_bad_url_is_one_line_for_every_command(url: str, fragment: str) -> None:
    for command in (
        ["status"],
        ["db", "current"],
        ["db", "upgrade"],
        ["db", "url"],
        ["runs", "show", RUN],
        ["purge", "--yes"],
        ["enqueue", REVIEW, "--kinds", KINDS],
        ["worker", "--kinds", KINDS],
    ):
        result = invoke(url, *command)
        if command == ["db", "url"] and "cannot reach" in fragment:
            assert result.exit_code == 0  # it names the URL; it does not connect
        else:
            assert_one_line_error(result, fragment)
        assert "s3cret" not in result.output


def test_a_bad_setting_is_one_line(migrated_url: str) -> None:
    result = invoke(migrated_url, "status", AGENTRUNS_SHUTDOWN_GRACE="forever")
    assert_one_line_error(result, "invalid setting AGENTRUNS_SHUTDOWN_GRACE")


def test_the_installed_command_prints_no_traceback_either(migrated_url: str) -> None:
    """Through the real entry point in a process of its own, as an operator runs it."""
    env = {**os.environ, "AGENTRUNS_DATABASE_URL": migrated_url}
    for args in (
        ["purge", "--older-than", "999999999d"],
        ["worker", "--kinds", KINDS, "--metrics-port", "70000"],
        ["status", "--nope"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "agentruns.entrypoints.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr + done.stdout
        assert done.stderr.strip().count("\n") == 0
        assert done.stderr.startswith("agentruns: error: ")


def test_the_console_without_its_extra_says_which_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the gateway does: one line naming the extra, not ModuleNotFoundError: starlette."""
    for name in list(sys.modules):
        if name == "starlette" or name.startswith(("starlette.", "agentruns.entrypoints.console")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "starlette", None)
    result = CliRunner().invoke(app, ["console"])
    assert_one_line_error(result, "pip install 'agentruns[console]'", "(starlette")
