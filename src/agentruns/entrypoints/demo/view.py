"""What the demo shows: a live table of runs by state, and the summary at the end."""

from __future__ import annotations

from collections import Counter

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from agentruns.app.stats import RunStatus
from agentruns.domain.bands import Band
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from agentruns.entrypoints.demo.report import DemoReport


def progress_view(status: RunStatus, extra: dict[str, object]) -> RenderableType:
    """Runs by band and state, a bar of ended runs, and the faults seen so far."""
    table = Table(title="agentruns demo: runs by state", title_justify="left", expand=False)
    table.add_column("band")
    for state in AgentRunState:
        table.add_column(str(state), justify="right")
    for band in Band:
        table.add_row(
            band.name.lower(), *(str(status.total(state, band=band)) for state in AgentRunState)
        )
    table.add_row(
        Text("all", style="bold"),
        *(Text(str(status.total(state)), style="bold") for state in AgentRunState),
    )
    offered = _int(extra.get("offered"))
    ended = status.total(AgentRunState.ENDED)
    outcomes = extra.get("outcomes")
    seen = outcomes if isinstance(outcomes, Counter) else Counter[str]()
    killed = extra.get("killed")
    line = Text.assemble(
        (f"{_float(extra.get('elapsed')):5.1f}s  ", "dim"),
        f"completed {seen.get('completed', 0)}  requeued {seen.get('requeued', 0)}  ",
        f"lease lost {seen.get('lease_lost', 0)}  taken back {extra.get('taken_back', 0)}  ",
        f"zombie writes refused {extra.get('zombie_refused', 0)}  ",
        (f"killed {killed}" if killed else "no worker killed yet", "red" if killed else "dim"),
    )
    bar = ProgressBar(total=max(offered + 1, status.total() or 1), completed=ended, width=60)
    grid = Table.grid()
    grid.add_row(table)
    grid.add_row(bar)
    grid.add_row(line)
    return grid


def summary_view(report: DemoReport) -> RenderableType:
    final = report.final
    parts: list[RenderableType] = []

    totals = Table(title="Summary", title_justify="left", show_header=False)
    totals.add_column("what")
    totals.add_column("count", justify="right")
    reasons = final.reasons()
    totals.add_row("runs enqueued", str(report.enqueued))
    faults = ", ".join(f"{name} x{count}" for name, count in sorted(report.faults.items()))
    totals.add_row("faults injected", f"{faults}, SIGKILL of {report.killed or 'no worker'}")
    totals.add_row("completed", str(reasons.get(TerminationReason.COMPLETED, 0)))
    totals.add_row("requeued after a failure (charged)", str(report.outcomes.get("requeued", 0)))
    for reason, count in sorted(reasons.items()):
        if reason.is_dead_letter:
            totals.add_row(f"dead-lettered: {reason}", str(count))
    totals.add_row("leases lost by live holders", str(report.outcomes.get("lease_lost", 0)))
    totals.add_row(
        "leases taken back by the reapers",
        f"{report.taken_back} ({report.taken_back_requeued} queued again)",
    )
    waits = [o.claimed_again_after for o in report.orphans if o.claimed_again_after is not None]
    if waits:
        totals.add_row(
            "the killed worker's runs waited (SIGKILL to next claim)",
            f"{min(waits):.1f}s to {max(waits):.1f}s (lease {report.lease.total_seconds():g}s)",
        )
    totals.add_row("queued runs ended past their deadline", str(report.overdue_ended))
    waiting = final.total(AgentRunState.QUEUED)
    totals.add_row(
        "still queued (inactive workspace, budget hold)",
        f"{waiting}: " + ", ".join(sorted(final.unavailable)),
    )
    totals.add_row("elapsed", f"{report.elapsed:.1f}s")
    parts.append(totals)

    killed = Table(
        title=f"The killed worker ({report.killed or 'none'}): how long its runs waited",
        title_justify="left",
    )
    killed.add_column("run")
    killed.add_column("kind")
    killed.add_column("epoch", justify="right")
    killed.add_column("taken back after", justify="right")
    killed.add_column("claimed again after", justify="right")
    for orphan in report.orphans:
        killed.add_row(
            str(orphan.fence.run_id)[:8],
            orphan.kind,
            str(orphan.fence.epoch),
            _seconds(orphan.taken_back_after),
            _seconds(orphan.claimed_again_after),
        )
    killed.caption = f"lease {report.lease.total_seconds():g}s; waits count from the SIGKILL"
    parts.append(killed)

    fairness = Table(title="Fairness: leased share per workspace", title_justify="left")
    fairness.add_column("workspace")
    fairness.add_column("share of runs", justify="right")
    fairness.add_column("leased share, whole run", justify="right")
    fairness.add_column("leased share while all had a backlog", justify="right")
    for workspace, share in report.run_share.items():
        fairness.add_row(
            workspace,
            f"{share:.0%}",
            f"{report.leased_share.get(workspace, 0.0):.0%}",
            f"{report.contended_share.get(workspace, 0.0):.0%}",
        )
    fairness.caption = (
        "within a band, claims go first to the workspace with the fewest leased runs, so a "
        "small tenant is not starved by a big one"
    )
    parts.append(fairness)

    checks = Table(title="Invariants", title_justify="left")
    checks.add_column("")
    checks.add_column("check")
    checks.add_column("detail")
    for check in report.checks:
        mark = Text("PASS", style="green") if check.passed else Text("FAIL", style="bold red")
        checks.add_row(mark, check.name, check.detail)
    parts.append(checks)
    return Group(*parts)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _float(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
