"""The commands an operator steers with: enqueue, a draining worker, runs show with its failed
attempts, runs retry, purge with --dry-run and a confirmation, postgres:// URLs, --database,
--version and help that shows every default."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import psycopg
import pytest
from sqlalchemy import make_url
from typer.testing import CliRunner, Result

from agentruns.entrypoints.cli import app, inspection

KINDS = "agentruns.entrypoints.demo.kinds:KINDS"
REVIEW = "agent.review"


def invoke(url: str, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(
        app,
        list(args),
        env={"AGENTRUNS_DATABASE_URL": url, "AGENTRUNS_POLL_INTERVAL": "0.1", "COLUMNS": "200"},
        input=input,
    )


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def enqueue(url: str, *args: str) -> UUID:
    return UUID(ok(invoke(url, "enqueue", REVIEW, "--kinds", KINDS, *args)).strip())


def shown(url: str, run_id: UUID) -> dict[str, object]:
    found: dict[str, object] = json.loads(ok(invoke(url, "runs", "show", str(run_id), "--json")))
    return found


def test_enqueue_prints_the_run_id_and_takes_every_field(postgres_url: str) -> None:
    run_id = enqueue(
        postgres_url,
        "--workspace",
        "acme",
        "--subject",
        "pr:7",
        "--band",
        "interactive",
        "--payload",
        '{"steps": 1}',
        "--due",
        "1h",
        "--deadline",
        "2099-01-01T00:00:00Z",
    )
    run = shown(postgres_url, run_id)
    assert (run["kind"], run["workspace"], run["subject"], run["band"]) == (
        REVIEW,
        "acme",
        "pr:7",
        "interactive",
    )
    assert run["payload"] == {"steps": 1}
    assert run["state"] == "queued"
    assert run["deadline_at"] == "2099-01-01T00:00:00+00:00"
    assert run["due_at"] > run["enqueued_at"]  # type: ignore[operator]


def test_runs_show_prints_the_result_a_run_ended_with(postgres_url: str) -> None:
    run_id = enqueue(
        postgres_url, "--payload", '{"steps": 1, "step_ms": 1, "result": {"verdict": "approve"}}'
    )
    ok(invoke(postgres_url, "worker", "--kinds", KINDS, "--drain"))
    run = shown(postgres_url, run_id)
    assert (run["state"], run["result"]) == ("ended", {"verdict": "approve"})
    table = ok(invoke(postgres_url, "runs", "show", str(run_id)))
    assert '{"verdict": "approve"}' in table


def test_runs_show_prints_what_the_run_s_steps_spent(postgres_url: str) -> None:
    run_id = enqueue(postgres_url, "--payload", '{"steps": 2, "step_ms": 1, "tokens": 400}')
    ok(invoke(postgres_url, "worker", "--kinds", KINDS, "--drain"))
    run = shown(postgres_url, run_id)
    assert run["usage"] == {"input_tokens": 800, "output_tokens": 200, "cost": "0.001"}
    table = ok(invoke(postgres_url, "runs", "show", str(run_id)))
    assert "800 input tokens, 200 output tokens, cost 0.001" in table


def test_a_failed_run_shows_its_error_and_traceback_and_a_retry_goes_on(postgres_url: str) -> None:
    """A 401 is not retryable: dead-lettered on its first attempt, with its record; `runs retry`
    continues it (one more attempt), and the continuation runs again."""
    failing = enqueue(postgres_url, "--subject", "pr:1", "--payload", '{"steps": 1, "fail": 401}')
    ok(invoke(postgres_url, "worker", "--kinds", KINDS, "--drain"))
    run = shown(postgres_url, failing)
    assert run["end_reason"] == "not_retryable"
    assert run["last_failure"] == {
        "error_type": "agentruns.ProviderError",
        "message": "provider answered 401",
        "failure_class": "auth",
    }
    [failure] = run["failures"]  # type: ignore[misc]
    assert failure["epoch"] == 1
    assert failure["attempt"] == 0
    assert "in scripted_steps" in failure["traceback"]

    table = ok(invoke(postgres_url, "runs", "show", str(failing)))
    for fragment in ("Failed attempts", "ProviderError: provider answered 401", "Traceback"):
        assert fragment in table

    retry = invoke(postgres_url, "runs", "retry", str(failing), "--kinds", KINDS)
    retried = UUID(ok(retry).strip())
    again = shown(postgres_url, retried)
    assert (again["continues"], again["attempt"], again["state"]) == (str(failing), 1, "queued")
    ok(invoke(postgres_url, "worker", "--kinds", KINDS, "--drain"))
    assert shown(postgres_url, retried)["end_reason"] == "not_retryable"
    twice = invoke(postgres_url, "runs", "retry", str(failing), "--kinds", KINDS)
    assert twice.exit_code == 1
    assert f"already continued by run {retried}" in twice.stderr
    completed = enqueue(postgres_url, "--subject", "pr:2", "--payload", '{"steps": 1}')
    ok(invoke(postgres_url, "worker", "--kinds", KINDS, "--drain"))
    not_failed = invoke(postgres_url, "runs", "retry", str(completed), "--kinds", KINDS)
    assert not_failed.exit_code == 1
    assert "only failed or dead-lettered runs are retried" in not_failed.stderr


@contextmanager
def role_without(url: str, privilege: str, table: str) -> Iterator[str]:
    """The URL of a login role of this test's own that may do everything agentruns needs but
    ``privilege`` on ``table``; the role is dropped after the block."""
    role = f"agentruns_{uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'secret'")
        # A non-superuser administrator (CI's) drops what the role owns only as its member.
        admin.execute(f"GRANT {role} TO CURRENT_USER")
        admin.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        admin.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
        admin.execute(f"REVOKE {privilege} ON {table} FROM {role}")
    try:
        yield (
            make_url(url)
            .set(username=role, password="secret")
            .render_as_string(hide_password=False)
        )
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def test_a_drain_whose_claims_fail_exits_non_zero_with_one_line(postgres_url: str) -> None:
    """A role that may not delete from the lanes' ledger cannot claim: the draining worker
    stops, says why in one line without a traceback, and exits 1; the runs stay queued."""
    queued = [
        enqueue(postgres_url, "--subject", f"pr:{n}", "--payload", '{"steps": 1}') for n in range(3)
    ]
    with role_without(postgres_url, "DELETE", "agent_workspace_delta") as limited:
        drained = invoke(limited, "worker", "--kinds", KINDS, "--drain")
    assert drained.exit_code == 1, drained.output
    [line] = [line for line in drained.stderr.splitlines() if line.startswith("agentruns: error")]
    assert "--drain stopped because its claim failed" in line
    assert "permission denied for table agent_workspace_delta" in line
    assert line.endswith("(`agentruns db grants --role worker|reader` prints what each role needs)")
    assert "Traceback" not in drained.stderr
    assert all(shown(postgres_url, run_id)["state"] == "queued" for run_id in queued)
    # With the privilege, the same drain claims them all and exits 0.
    ok(invoke(postgres_url, "worker", "--kinds", KINDS, "--drain"))
    assert all(shown(postgres_url, run_id)["state"] == "ended" for run_id in queued)


def test_a_worker_whose_role_cannot_write_its_holder_row_still_drains(postgres_url: str) -> None:
    """The heartbeat is beside the work, not in its way: without any privilege on agent_holder
    the worker says so in a warning line and drains as before."""
    run_id = enqueue(postgres_url, "--subject", "pr:1", "--payload", '{"steps": 1}')
    with role_without(postgres_url, "ALL", "agent_holder") as limited:
        drained = invoke(limited, "worker", "--kinds", KINDS, "--drain")
    assert drained.exit_code == 0, drained.output
    assert "holder start failed" in drained.stderr
    assert "permission denied for table agent_holder" in drained.stderr
    assert shown(postgres_url, run_id)["state"] == "ended"


def test_purge_counts_with_dry_run_and_asks_on_a_terminal(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = enqueue(postgres_url, "--subject", "a")
    gone = enqueue(postgres_url, "--subject", "b")
    ok(invoke(postgres_url, "runs", "cancel", str(gone)))
    dry = invoke(postgres_url, "purge", "--older-than", "0", "--dry-run")
    assert "would purge 1 runs" in ok(dry)
    assert shown(postgres_url, gone)["state"] == "ended"

    monkeypatch.setattr(inspection, "is_terminal", lambda: True)
    declined = invoke(postgres_url, "purge", "--older-than", "0", input="n\n")
    assert declined.exit_code == 1
    assert "Delete 1 runs" in declined.stdout
    assert "nothing purged" in declined.stderr
    assert shown(postgres_url, gone)["state"] == "ended"
    accepted = invoke(postgres_url, "purge", "--older-than", "0", input="y\n")
    assert "purged 1 runs" in ok(accepted)
    assert invoke(postgres_url, "runs", "show", str(gone)).exit_code == 1
    assert shown(postgres_url, kept)["state"] == "queued"


def test_purge_without_a_terminal_or_with_yes_does_not_ask(postgres_url: str) -> None:
    gone = enqueue(postgres_url, "--subject", "b")
    ok(invoke(postgres_url, "runs", "cancel", str(gone)))
    assert "purged 1 runs" in ok(invoke(postgres_url, "purge", "--older-than", "0", "--yes"))


def test_a_postgres_scheme_url_is_accepted(postgres_url: str) -> None:
    url = postgres_url.replace("postgresql://", "postgres://", 1)
    assert "(newest)" in ok(invoke(url, "db", "current"))
    run_id = enqueue(url, "--subject", "s")
    assert shown(url, run_id)["state"] == "queued"


def test_status_and_db_url_say_where_the_database_is(postgres_url: str) -> None:
    status = ok(invoke(postgres_url, "status"))
    assert status.startswith("database: postgresql")
    fields = json.loads(ok(invoke(postgres_url, "status", "--json")))
    assert fields["database"].startswith("postgresql")
    assert fields["expired_leases_by_kind"] == []
    assert ok(invoke(postgres_url, "db", "url")).strip() == fields["database"]


def test_another_database_on_the_server_is_inspected_with_database(
    postgres_url: str, postgres_server: str
) -> None:
    """As the demo's agentruns_demo is: --database names it on the same server."""
    from sqlalchemy import make_url

    name = make_url(postgres_url).database
    assert name is not None
    run_id = enqueue(postgres_url, "--subject", "s")
    other = invoke(postgres_server, "runs", "show", str(run_id), "--database", name, "--json")
    assert json.loads(ok(other))["id"] == str(run_id)


def test_version_and_help_that_shows_every_default() -> None:
    runner = CliRunner()
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0
    assert version.stdout.startswith("agentruns 0.")
    commands = [
        ["status"],
        ["enqueue"],
        ["worker"],
        ["reaper"],
        ["gateway"],
        ["purge"],
        ["demo"],
        ["db", "upgrade"],
        ["db", "url"],
        ["db", "stop"],
        ["runs", "show"],
        ["runs", "cancel"],
        ["runs", "signal"],
        ["runs", "retry"],
    ]
    for command in commands:
        shown = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
        assert shown.exit_code == 0, shown.output
        rows = [line for line in shown.stdout.splitlines() if line.startswith("│ --")]
        assert rows, shown.stdout
        for row in rows:
            if "--help" in row or "<bool>" in row:
                continue  # a flag is off unless given
            assert "[default: " in row, f"{' '.join(command)}: {row}"


def test_runs_list_filters_pages_and_shows_the_last_failure(postgres_url: str) -> None:
    first = enqueue(postgres_url, "--subject", "pr:1", "--payload", '{"steps": 1, "fail": 401}')
    enqueue(postgres_url, "--subject", "pr:2", "--payload", '{"steps": 1}')
    ok(invoke(postgres_url, "worker", "--kinds", KINDS, "--drain"))
    third = enqueue(postgres_url, "--subject", "pr:3", "--workspace", "other")

    everything = json.loads(ok(invoke(postgres_url, "runs", "list", "--json")))
    assert [run["subject"] for run in everything["runs"]] == ["pr:3", "pr:2", "pr:1"]
    assert everything["next_cursor"] is None

    failed = json.loads(
        ok(invoke(postgres_url, "runs", "list", "--reason", "not_retryable", "--json"))
    )
    [dead] = failed["runs"]
    assert dead["id"] == str(first)
    assert dead["last_failure"]["message"] == "provider answered 401"
    table = ok(invoke(postgres_url, "runs", "list", "--reason", "not_retryable"))
    assert "provider answered 401" in table
    assert "ended: not_retryable" in table

    queued = json.loads(ok(invoke(postgres_url, "runs", "list", "--state", "queued", "--json")))
    assert [run["id"] for run in queued["runs"]] == [str(third)]
    assert json.loads(
        ok(invoke(postgres_url, "runs", "list", "--workspace", "other", "--kind", REVIEW, "--json"))
    )["runs"][0]["id"] == str(third)

    page = invoke(postgres_url, "runs", "list", "--limit", "2", "--json")
    first_page = json.loads(ok(page))
    assert [run["subject"] for run in first_page["runs"]] == ["pr:3", "pr:2"]
    rest = invoke(
        postgres_url,
        "runs",
        "list",
        "--limit",
        "2",
        "--cursor",
        first_page["next_cursor"],
        "--json",
    )
    assert [run["subject"] for run in json.loads(ok(rest))["runs"]] == ["pr:1"]
    shown_page = invoke(postgres_url, "runs", "list", "--limit", "2")
    assert f"--cursor {first_page['next_cursor']}" in shown_page.stderr


def test_enqueue_with_a_key_prints_the_run_it_names_and_says_whether_it_is_new(
    postgres_url: str,
) -> None:
    args = ["enqueue", REVIEW, "--kinds", KINDS, "--key", "webhook-9", "--payload", '{"steps": 1}']
    first = invoke(postgres_url, *args)
    again = invoke(postgres_url, *args)
    run_id = UUID(ok(first).strip())
    assert UUID(ok(again).strip()) == run_id
    assert "new run, key 'webhook-9'" in first.stderr
    assert f"already enqueued with key 'webhook-9': run {run_id} is queued" in again.stderr
    run = shown(postgres_url, run_id)
    assert run["key"] == "webhook-9"
    assert run["subject"] == f"{REVIEW}:webhook-9"
    table = ok(invoke(postgres_url, "runs", "show", str(run_id)))
    assert "webhook-9" in table

    other = invoke(postgres_url, *args[:-1], '{"steps": 2}')
    assert other.exit_code != 0
    assert f"names run {run_id}" in other.output
    assert "payload differ" in other.output
    bad = invoke(postgres_url, "enqueue", REVIEW, "--kinds", KINDS, "--key", "")
    assert bad.exit_code != 0
    assert "enqueue key" in bad.output
    listed = json.loads(ok(invoke(postgres_url, "runs", "list", "--json")))
    assert len(listed["runs"]) == 1


def test_enqueue_on_active_rejects_in_one_line_or_interrupts(postgres_url: str) -> None:
    """A rejected enqueue says which run is active, exits 1, writes nothing; an interrupt ends
    that run cancelled and queues the new one."""
    args = ["enqueue", REVIEW, "--kinds", KINDS, "--subject", "chat:1"]
    first = UUID(ok(invoke(postgres_url, *args)).strip())
    refused = invoke(postgres_url, *args, "--on-active", "reject")
    assert refused.exit_code == 1
    assert f"has an active run {first}" in refused.output
    assert "Traceback" not in refused.output
    bad = invoke(postgres_url, *args, "--on-active", "sometimes")
    assert bad.exit_code != 0
    assert "on_active is one of" in bad.output
    second = UUID(ok(invoke(postgres_url, *args, "--on-active", "interrupt")).strip())
    assert shown(postgres_url, first)["end_reason"] == "cancelled"
    assert shown(postgres_url, second)["state"] == "queued"
    listed = json.loads(ok(invoke(postgres_url, "runs", "list", "--json")))
    assert len(listed["runs"]) == 2


def test_enqueue_on_active_merge_joins_the_queued_run_with_a_debounce(postgres_url: str) -> None:
    """A merge prints the run it joined and says so on stderr; the debounce moves its due
    time; a bad --debounce is one line, and a debounce without merge is refused."""
    args = ["enqueue", REVIEW, "--kinds", KINDS, "--subject", "chat:m", "--on-active", "merge"]
    made = invoke(postgres_url, *args, "--payload", '{"m": 1}')
    first = UUID(ok(made).strip())
    assert "a new run" in made.stderr
    joined = invoke(postgres_url, *args, "--payload", '{"m": 2}', "--debounce", "600")
    assert UUID(ok(joined).strip()) == first
    assert f"merged into run {first}, no new run" in joined.stderr
    due = datetime.fromisoformat(str(shown(postgres_url, first)["due_at"]))
    assert due > datetime.now(UTC) + timedelta(seconds=500)
    bad = invoke(postgres_url, *args, "--debounce", "-1")
    assert bad.exit_code != 0
    assert "--debounce is a number of seconds" in bad.output
    plain = invoke(postgres_url, "enqueue", REVIEW, "--kinds", KINDS, "--debounce", "5")
    assert plain.exit_code != 0
    assert "a debounce is a merge's" in plain.output
    listed = json.loads(ok(invoke(postgres_url, "runs", "list", "--json")))
    assert len(listed["runs"]) == 1


def test_budget_set_show_remove_and_status_say_why_a_workspace_waits(postgres_url: str) -> None:
    """ADRs/0033: a budget spent holds its workspace; show and status say why, until when."""
    workspace = f"budgeted-{uuid4().hex[:8]}"
    set_out = ok(invoke(postgres_url, "budget", "set", workspace, "--tokens", "100"))
    assert "0 of 100 tokens" in set_out
    run_id = enqueue(
        postgres_url,
        "--workspace",
        workspace,
        "--payload",
        '{"steps": 1, "step_ms": 1, "tokens": 400}',
    )
    ok(invoke(postgres_url, "worker", "--kinds", KINDS, "--drain"))
    assert shown(postgres_url, run_id)["state"] == "ended"
    shown_budget = json.loads(ok(invoke(postgres_url, "budget", "show", workspace, "--json")))
    assert shown_budget["spent_tokens"] == 500
    assert shown_budget["held_until"] is not None
    text = ok(invoke(postgres_url, "budget", "show", workspace))
    assert "held: budget spent (100 tokens per day) until" in text
    status = ok(invoke(postgres_url, "status"))
    assert "held: budget spent (100 tokens per day)" in " ".join(status.split())
    assert "removed" in ok(invoke(postgres_url, "budget", "remove", workspace))
    refused = invoke(postgres_url, "budget", "show", workspace)
    assert refused.exit_code == 1
    assert "has no budget" in refused.output
    assert "Traceback" not in refused.output
    bad = invoke(postgres_url, "budget", "set", workspace, "--period", "week", "--tokens", "1")
    assert bad.exit_code == 1
    assert "Traceback" not in bad.output
    neither = invoke(postgres_url, "budget", "set", workspace)
    assert neither.exit_code == 1
    assert "neither" in neither.output


def test_budget_set_rolling_takes_a_window_and_show_prints_it(postgres_url: str) -> None:
    """ADRs/0033, "Rolling windows": --period rolling --window 24h; show prints the window."""
    workspace = f"rolling-{uuid4().hex[:8]}"
    args = ("budget", "set", workspace, "--tokens", "100", "--period", "rolling")
    set_out = ok(invoke(postgres_url, *args, "--window", "24h"))
    assert f"workspace {workspace}: budget per rolling 1d" in set_out
    assert "0 of 100 tokens" in set_out
    shown_budget = json.loads(ok(invoke(postgres_url, "budget", "show", workspace, "--json")))
    assert (shown_budget["period"], shown_budget["window"]) == ("rolling", "1d")
    assert (shown_budget["spent_tokens"], shown_budget["held_until"]) == (0, None)
    for bad, said in (
        ((), "--period rolling needs --window"),
        (("--window", "400d"), "at most 366 days"),
        (("--window", "soon"), "--window"),
        (("--window", "0s"), "longer than zero"),
    ):
        refused = invoke(postgres_url, *args, *bad)
        assert refused.exit_code == 1
        assert said in refused.output
        assert "Traceback" not in refused.output
    daily = invoke(postgres_url, "budget", "set", workspace, "--tokens", "1", "--window", "1h")
    assert daily.exit_code == 1
    assert "--window is for --period rolling" in daily.output
    shown_budget = json.loads(ok(invoke(postgres_url, "budget", "show", workspace, "--json")))
    assert shown_budget["window"] == "1d"  # nothing refused was written
