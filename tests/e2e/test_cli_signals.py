"""``agentruns runs signal`` and the waiting runs' listing (ADRs/0025): a run waits in a worker,
is found with ``runs list --state waiting``, shown with what it waits for, signalled once per
signal id, and resumes; every refusal is one line."""

from __future__ import annotations

import json
from uuid import UUID

from tests.e2e.test_cli_commands import invoke, ok, shown

WAITS = "tests.e2e.wait_host:KINDS"


def enqueue(url: str, subject: str) -> UUID:
    return UUID(
        ok(invoke(url, "enqueue", "approve", "--kinds", WAITS, "--subject", subject)).strip()
    )


def test_a_waiting_run_is_listed_shown_signalled_once_and_resumes(postgres_url: str) -> None:
    run_id = enqueue(postgres_url, "approval:1")
    ok(invoke(postgres_url, "worker", "--kinds", WAITS, "--drain"))
    run = shown(postgres_url, run_id)
    assert run["state"] == "queued"
    waiting = run["waiting"]
    assert isinstance(waiting, dict)
    assert waiting["for"] == "approval"
    listed = json.loads(ok(invoke(postgres_url, "runs", "list", "--state", "waiting", "--json")))
    assert [found["id"] for found in listed["runs"]] == [str(run_id)]
    table = ok(invoke(postgres_url, "runs", "show", str(run_id)))
    assert "for signal 'approval' since " in table
    assert waiting["since"] is not None
    assert "waiting: approval" in ok(invoke(postgres_url, "runs", "list", "--state", "waiting"))

    sent = invoke(
        postgres_url,
        "runs",
        "signal",
        str(run_id),
        "approval",
        "--payload",
        '{"ok": true}',
        "--signal-id",
        "mail-7",
    )
    assert "signal 'approval' delivered" in ok(sent)
    again = invoke(
        postgres_url,
        "runs",
        "signal",
        str(run_id),
        "approval",
        "--payload",
        '{"ok": false}',
        "--signal-id",
        "mail-7",
    )
    assert "already" in ok(again)
    assert shown(postgres_url, run_id)["waiting"] is None

    ok(invoke(postgres_url, "worker", "--kinds", WAITS, "--drain"))
    done = shown(postgres_url, run_id)
    assert (done["state"], done["end_reason"], done["attempt"]) == ("ended", "completed", 0)
    events = [event for event in done["events"] if event["type"] == "step.recorded"]  # type: ignore[attr-defined,index]
    assert [event["data"]["result"] for event in events] == [
        {"signal_id": "mail-7", "payload": {"ok": True}},  # the first delivery, not the repeat
        {"ok": True},
    ]


def test_signal_refusals_are_one_line(postgres_url: str) -> None:
    run_id = enqueue(postgres_url, "approval:2")
    bad = invoke(postgres_url, "runs", "signal", str(run_id), "approval", "--payload", "{nope")
    assert bad.exit_code == 1
    assert "--payload is not JSON" in bad.stderr
    assert "Traceback" not in bad.output
    ok(invoke(postgres_url, "runs", "cancel", str(run_id)))
    ended = invoke(postgres_url, "runs", "signal", str(run_id), "approval")
    assert ended.exit_code == 1
    assert "ended cancelled" in ended.stderr
    assert len(ended.stderr.strip().splitlines()) == 1
    unknown = invoke(postgres_url, "runs", "signal", "00000000-0000-4000-8000-000000000000", "x")
    assert unknown.exit_code == 1
    assert "no run" in unknown.stderr
    assert "Traceback" not in unknown.output
