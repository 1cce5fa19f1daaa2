"""How the commands show runs: rich tables for ``status``, ``runs show`` and ``runs list``, and
the same as plain JSON values for ``--json``."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from agentruns.app.ports import RunEvent
from agentruns.app.stats import RunStatus
from agentruns.domain.bands import Band
from agentruns.domain.failure_records import FailureRecord
from agentruns.domain.redaction import redact_json
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.usage import cost_text
from agentruns.domain.waits import is_waiting


def _row(table: Table, *cells: str | Text) -> None:
    """One row of plain text: a cell is data (a subject, a message, ``[redacted]``), never Rich
    markup, which would swallow anything in brackets."""
    table.add_row(*(Text(cell) if isinstance(cell, str) else cell for cell in cells))


def duration(value: timedelta | None) -> str:
    if value is None:
        return "-"
    seconds = value.total_seconds()
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def status(report: RunStatus, orphan_after: timedelta) -> RenderableType:
    by_band = Table(title="Runs by band", title_justify="left")
    by_band.add_column("band")
    for state in AgentRunState:
        by_band.add_column(str(state), justify="right")
    for band in Band:
        _row(
            by_band,
            band.name.lower(),
            *(str(report.total(state, band=band)) for state in AgentRunState),
        )

    holds = {hold.workspace: hold for hold in report.holds}
    by_workspace = Table(title="Runs by workspace", title_justify="left")
    by_workspace.add_column("workspace")
    for state in AgentRunState:
        by_workspace.add_column(str(state), justify="right")
    by_workspace.add_column("offered")
    for workspace in sorted(set(report.workspaces()) | set(report.inactive) | set(holds)):
        if workspace in report.inactive:
            offered = Text("inactive", style="yellow")
        elif workspace in holds:
            hold = holds[workspace]
            # A budget's hold says why the workspace's runs wait (ADRs/0033).
            offered = Text(
                f"held: {hold.reason} until {hold.until:%Y-%m-%d %H:%M:%S}"
                if hold.by_budget
                else f"budget held until {hold.until:%Y-%m-%d %H:%M:%S}",
                style="yellow",
            )
        else:
            offered = Text("yes")
        _row(
            by_workspace,
            workspace,
            *(str(report.total(state, workspace=workspace)) for state in AgentRunState),
            offered,
        )

    by_reason = Table(title="Ended runs by reason", title_justify="left")
    by_reason.add_column("reason")
    by_reason.add_column("runs", justify="right")
    by_reason.add_column("")
    for reason, count in sorted(report.reasons().items()):
        _row(by_reason, str(reason), str(count), "dead-letter" if reason.is_dead_letter else "")

    facts = Table(show_header=False, box=None)
    facts.add_column("fact")
    facts.add_column("value")
    _row(facts, "expired leases (waiting for the reaper)", str(report.expired_leases))
    orphaned = report.orphaned(orphan_after)
    _row(
        facts,
        f"orphaned leases (expired over {duration(orphan_after)} ago)",
        Text(
            ", ".join(
                f"{leases.kind}: {leases.count} (run a reaper whose --kinds registers it)"
                for leases in orphaned
            )
            or "none",
            style="yellow" if orphaned else "",
        ),
    )
    _row(facts, "oldest due run has waited", duration(report.oldest_due_age))
    _row(
        facts,
        "budget holds",
        ", ".join(
            f"{hold.workspace} until {hold.until:%Y-%m-%d %H:%M:%S}"
            + (f" ({hold.reason})" if hold.reason else "")
            for hold in report.holds
        )
        or "none",
    )
    if not report.counts:
        return Group(Text("no runs yet"), facts)
    return Group(by_band, by_workspace, by_reason, facts)


def status_fields(report: RunStatus, orphan_after: timedelta) -> dict[str, object]:
    """The status as plain JSON values."""
    age = report.oldest_due_age
    orphaned = {leases.kind for leases in report.orphaned(orphan_after)}
    return {
        "now": report.now.isoformat(),
        "runs": [
            {
                "state": str(count.state),
                "band": count.band.name.lower(),
                "workspace": count.workspace,
                "end_reason": None if count.end_reason is None else str(count.end_reason),
                "count": count.count,
            }
            for count in report.counts
        ],
        "expired_leases": report.expired_leases,
        "expired_leases_by_kind": [
            {
                "kind": leases.kind,
                "count": leases.count,
                "oldest_leased_until": leases.oldest_leased_until.isoformat(),
                "orphaned": leases.kind in orphaned,
            }
            for leases in report.expired_by_kind
        ],
        "oldest_due_age_seconds": None if age is None else age.total_seconds(),
        "budget_holds": [
            {
                "workspace": hold.workspace,
                "until": hold.until.isoformat(),
                "reason": hold.reason,
                "by_budget": hold.by_budget,
            }
            for hold in report.holds
        ],
        "inactive_workspaces": list(report.inactive),
    }


def run(shown: AgentRun, events: list[RunEvent], failures: list[FailureRecord]) -> RenderableType:
    fields = Table(title=f"Run {shown.id}", title_justify="left", show_header=False)
    fields.add_column("field")
    fields.add_column("value")
    for name, value in (
        ("kind", shown.kind),
        ("workspace", shown.workspace),
        ("subject", shown.subject),
        ("band", shown.band.name.lower()),
        ("state", str(shown.state)),
        ("end reason", str(shown.end_reason or "-")),
        ("epoch", str(shown.epoch)),
        ("attempt", str(shown.attempt)),
        ("holder", shown.holder or "-"),
        ("enqueued at", shown.enqueued_at.isoformat()),
        ("due at", shown.due_at.isoformat()),
        ("leased until", shown.leased_until.isoformat() if shown.leased_until else "-"),
        ("deadline at", shown.deadline_at.isoformat() if shown.deadline_at else "-"),
        ("ended at", shown.ended_at.isoformat() if shown.ended_at else "-"),
        ("continues", str(shown.continues or "-")),
        ("enqueue key", shown.key or "-"),
        ("waiting", _waiting(shown)),
        ("last failure", _last_failure(shown)),
        ("result", "-" if shown.result is None else json.dumps(redact_json(shown.result))),
        ("usage", usage_text(shown)),
        ("payload", json.dumps(redact_json(shown.payload))),
    ):
        _row(fields, name, value)

    epochs = Table(title="Epochs (one per claim)", title_justify="left")
    epochs.add_column("epoch", justify="right")
    epochs.add_column("events", justify="right")
    epochs.add_column("first event")
    epochs.add_column("last event")
    for epoch in range(1, shown.epoch + 1):
        mine = [event for event in events if event.epoch == epoch]
        _row(
            epochs,
            str(epoch),
            str(len(mine)),
            mine[0].created_at.isoformat() if mine else "-",
            mine[-1].created_at.isoformat() if mine else "-",
        )

    listed = Table(title="Events", title_justify="left")
    listed.add_column("seq", justify="right")
    listed.add_column("epoch", justify="right")
    listed.add_column("type")
    listed.add_column("data")
    listed.add_column("at")
    for event in events:
        _row(
            listed,
            str(event.seq),
            str(event.epoch),
            event.type,
            json.dumps(redact_json(event.data)),
            event.created_at.isoformat(),
        )
    parts: list[RenderableType] = [fields, epochs, listed]
    if failures:
        failed = Table(title="Failed attempts", title_justify="left")
        for column in ("#", "epoch", "attempt", "class", "error", "holder", "at"):
            failed.add_column(
                column, justify="right" if column in ("#", "epoch", "attempt") else "left"
            )
        for number, failure in enumerate(failures, start=1):
            _row(
                failed,
                str(number),
                str(failure.epoch),
                str(failure.attempt),
                str(failure.failure_class)
                + (
                    ""
                    if failure.retry_after is None
                    else f" (retry after {failure.retry_after:g}s)"
                ),
                f"{failure.error_type}: {failure.message}",
                failure.holder or "-",
                failure.recorded_at.isoformat(),
            )
        parts.append(failed)
        for number, failure in enumerate(failures, start=1):
            if failure.traceback:
                parts.append(Text(f"Traceback of failed attempt {number} (epoch {failure.epoch}):"))
                parts.append(Text(failure.traceback.rstrip()))
    return Group(*parts)


def _last_failure(shown: AgentRun) -> str:
    failure = shown.last_failure
    return "-" if failure is None else f"{failure} ({failure.failure_class})"


def run_fields(
    shown: AgentRun, events: list[RunEvent], failures: list[FailureRecord]
) -> dict[str, object]:
    """A run, its events and its failed attempts as plain JSON values."""
    return {
        **run_summary(shown),
        "events": [
            {
                "seq": event.seq,
                "epoch": event.epoch,
                "type": event.type,
                "data": redact_json(event.data),
                "at": event.created_at.isoformat(),
            }
            for event in events
        ],
        "failures": [failure_fields(failure) for failure in failures],
    }


def failure_fields(failure: FailureRecord) -> dict[str, object]:
    return {
        "epoch": failure.epoch,
        "attempt": failure.attempt,
        "holder": failure.holder,
        "error_type": failure.error_type,
        "message": failure.message,
        "failure_class": str(failure.failure_class),
        "traceback": failure.traceback,
        "at": failure.recorded_at.isoformat(),
        "retry_after": failure.retry_after,
    }


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def usage_text(shown: AgentRun) -> str:
    """A run's usage totals in a line (ADRs/0033): ``-`` when its steps reported none."""
    if not (shown.input_tokens or shown.output_tokens or shown.cost):
        return "-"
    return (
        f"{shown.input_tokens} input tokens, {shown.output_tokens} output tokens, "
        f"cost {cost_text(shown.cost)}"
    )


def run_summary(shown: AgentRun) -> dict[str, object]:
    """A run's own fields as plain JSON values (its last failure included)."""
    failure = shown.last_failure
    return {
        "id": str(shown.id),
        "kind": shown.kind,
        "workspace": shown.workspace,
        "subject": shown.subject,
        "band": shown.band.name.lower(),
        "state": str(shown.state),
        "end_reason": None if shown.end_reason is None else str(shown.end_reason),
        "epoch": shown.epoch,
        "attempt": shown.attempt,
        "holder": shown.holder,
        "enqueued_at": shown.enqueued_at.isoformat(),
        "due_at": shown.due_at.isoformat(),
        "leased_until": _time(shown.leased_until),
        "deadline_at": _time(shown.deadline_at),
        "ended_at": _time(shown.ended_at),
        "continues": None if shown.continues is None else str(shown.continues),
        "key": shown.key,
        "waiting": None
        if not is_waiting(shown)
        else {
            "for": shown.waiting_for,
            "since": _time(shown.waiting_since),
            "until": _time(shown.waiting_until),
        },
        "result": None if shown.result is None else redact_json(shown.result),
        "usage": {
            "input_tokens": shown.input_tokens,
            "output_tokens": shown.output_tokens,
            "cost": cost_text(shown.cost),
        },
        "last_failure": None
        if failure is None
        else {
            "error_type": failure.error_type,
            "message": failure.message,
            "failure_class": str(failure.failure_class),
        },
        "payload": redact_json(shown.payload),
    }


def run_list(runs: list[AgentRun]) -> RenderableType:
    """Runs as rows: what each is, where it stands, and why it last failed."""
    if not runs:
        return Text("no runs")
    listed = Table(title="Runs (newest first)", title_justify="left")
    for column in ("id", "kind", "workspace", "subject", "band", "state", "attempt", "enqueued"):
        listed.add_column(column, justify="right" if column == "attempt" else "left")
    listed.add_column("last failure")
    for shown in runs:
        state = str(shown.state) if shown.end_reason is None else f"ended: {shown.end_reason}"
        if is_waiting(shown):
            state = "asleep" if shown.waiting_for is None else f"waiting: {shown.waiting_for}"
        _row(
            listed,
            str(shown.id),
            shown.kind,
            shown.workspace,
            shown.subject,
            shown.band.name.lower(),
            state,
            str(shown.attempt),
            shown.enqueued_at.strftime("%Y-%m-%d %H:%M:%S"),
            _short_failure(shown),
        )
    return listed


def _short_failure(shown: AgentRun) -> str:
    """The last failure with its type's own name only (``ProviderError``, not its module)."""
    failure = shown.last_failure
    if failure is None:
        return "-"
    name = failure.error_type.rsplit(".", 1)[-1]
    return f"{name}: {failure.message}" if failure.message else name


def _waiting(shown: AgentRun) -> str:
    """What a waiting run waits for and until when (ADRs/0025): a signal, or a sleep."""
    if not is_waiting(shown) or shown.waiting_until is None:
        return "-"
    until = shown.waiting_until.isoformat()
    since = "" if shown.waiting_since is None else f" since {shown.waiting_since.isoformat()}"
    if shown.waiting_for is None:
        return f"asleep{since} until {until}"
    return f"for signal {shown.waiting_for!r}{since} until {until}"
