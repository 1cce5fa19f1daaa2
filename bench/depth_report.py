"""The depth section of ``bench/RESULTS.md``: each measure's table, its target, met or missed."""

from __future__ import annotations

import inspect
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from agentruns.app.settler import GroupSettler

if TYPE_CHECKING:
    from bench.depth import ClaimPoint, Results

TAKE_BACK_LEASES = 10_000
_DEFAULT_GROUP = inspect.signature(GroupSettler).parameters["max_group"].default
TAKE_BACK_SECONDS = 3.0


@dataclass(frozen=True)
class Verdict:
    """One target of issue 10 (or 22) as this run measured it."""

    # the measure it belongs to: queue, workspaces, leased, drain, snapshot, takeback, renewals
    key: str
    measure: str
    measured: float
    target: str
    met: bool
    shown: str  # how ``measured`` reads


def _met(verdict: Verdict) -> str:
    return "met" if verdict.met else "**missed**"


def _ratio(points: Sequence[ClaimPoint]) -> float:
    first, last = points[0].single[0], points[-1].single[0]
    return last / first if first else float("inf")


def verdicts(results: Results) -> list[Verdict]:
    found = []
    if results.queue:
        q = results.queue
        ratio = _ratio(q)
        found.append(
            Verdict(
                "queue",
                f"claim p50 at {q[-1].queued:,} queued vs {q[0].queued:,} queued",
                ratio, "≤ 1.5x", ratio <= 1.5, f"{ratio:.2f}x",
            )
        )  # fmt: skip
    if results.workspaces:
        w = results.workspaces
        ratio = _ratio(w)
        found.append(
            Verdict(
                "workspaces",
                f"claim p50 at {w[-1].workspaces:,} open workspaces vs at {w[0].workspaces:,} "
                f"({w[0].queued:,} queued)",
                ratio, "≤ 2x", ratio <= 2.0, f"{ratio:.2f}x",
            )
        )  # fmt: skip
    if results.leased:
        lp = results.leased
        ratio = _ratio(lp)
        found.append(
            Verdict(
                "leased",
                f"claim p50 with {lp[-1].leased:,} leased runs vs with {lp[0].leased:,}",
                ratio, "≤ 2x", ratio <= 2.0, f"{ratio:.2f}x",
            )
        )  # fmt: skip
    # The largest of the drain measure's sizes, and the million-run drain when measured, each
    # against the smallest.
    larger = ([results.drains[-1]] if len(results.drains) >= 2 else []) + (
        [results.million] if results.million is not None and results.drains else []
    )
    for large in larger:
        small = results.drains[0]
        ratio = large.rate / small.rate
        found.append(
            Verdict(
                "drain",
                f"{large.runs:,}-run drain rate vs {small.runs:,}-run drain rate",
                ratio, "≥ 0.8x", ratio >= 0.8, f"{ratio:.2f}x",
            )
        )  # fmt: skip
    if results.snapshot is not None and results.snapshot.held and results.snapshot.without:
        ratio = results.snapshot.ratio
        found.append(
            Verdict(
                "snapshot",
                "worker loop while another session holds a REPEATABLE READ snapshot open for "
                f"the whole drain, vs without ({results.snapshot.runs:,} runs)",
                ratio, "≥ 0.7x", ratio >= 0.7, f"{ratio:.2f}x",
            )
        )  # fmt: skip
    two = [t for t in results.take_backs if t.replicas == 2]
    if two:
        t = two[0]
        # Judged at the target's size: a smaller run scales its time to 10,000 leases.
        scaled = t.seconds * TAKE_BACK_LEASES / max(t.expired, 1)
        shown = f"{t.seconds:.2f} s" + (
            ""
            if t.expired == TAKE_BACK_LEASES
            else f" for {t.expired:,} (~{scaled:.1f} s per 10,000)"
        )
        found.append(
            Verdict(
                "takeback",
                "10,000 expired leases taken back, two reapers",
                scaled, "≤ 3 s", scaled <= TAKE_BACK_SECONDS and t.taken_back == t.expired, shown,
            )
        )  # fmt: skip
    if results.renewals is not None:
        r = results.renewals
        found.append(
            Verdict(
                "renewals",
                f"renewals/s over {r.leased:,} leased runs, worker group commit",
                r.group_per_s, "≥ 10,000/s", r.group_per_s >= 10_000, f"{r.group_per_s:,.0f}/s",
            )
        )  # fmt: skip
    return found


def _claims_table(points: Sequence[ClaimPoint]) -> list[str]:
    batch = any(p.batch is not None for p in points)
    lines = [
        "| queued runs | open workspaces | subjects | leased before | load (s) "
        "| single claim p50 / p99 (ms) |" + (" batch-10 claim p50 / p99 (ms) |" if batch else ""),
        "| " + " | ".join(["---:"] * (6 + batch)) + " |",
    ]
    for p in points:
        row = (
            f"| {p.queued:,} | {p.workspaces:,} | {p.subjects:,} | {p.leased:,} "
            f"| {p.load_s:.1f} | {p.single[0]:.2f} / {p.single[1]:.2f} |"
        )
        if batch:
            row += " - |" if p.batch is None else f" {p.batch[0]:.2f} / {p.batch[1]:.2f} |"
        lines.append(row)
    return lines


def _verdict_line(found: list[Verdict], key: str) -> list[str]:
    return [
        f"{v.measure}: {v.shown} (target {v.target}: {_met(v)})." for v in found if v.key == key
    ]


def render(
    results: Results,
    *,
    command: str,
    started: datetime,
    finished: datetime,
    load: tuple[str, str],
    version: str,
    note: str,
) -> str:
    found = verdicts(results)
    scale = results.scale
    minutes = (finished - started).total_seconds() / 60
    lines = [
        "## Depth: the claim, the drain, the take-back and the renewal against scale",
        "",
        f"Command: `{command}` (via `make depth`). Written by the run itself; do not edit by hand.",
        "",
        f"- Run: {started:%Y-%m-%d %H:%M} - {finished:%H:%M} UTC ({minutes:.1f} min).",
        f"- Machine: {os.cpu_count()} cores; load average before / after: {load[0]} / {load[1]}.",
        f"- {version}.",
    ]
    if note:
        lines.append(f"- Note: {note}")
    lines += ["", "### Targets (issues 10 and 22)", "", "| measure | measured | target | met |"]
    lines.append("| --- | ---: | ---: | --- |")
    lines += [f"| {v.measure} | {v.shown} | {v.target} | {_met(v)} |" for v in found]
    claims = (
        f"{scale.claims} single claims per point (and {max(10, scale.claims // 10)} batch "
        "claims of 10), each its own transaction through `AgentRuns.claim`, each claimed run "
        "ended untimed after its claim."
    )
    if results.queue:
        lines += ["", "### Queue axis: claim cost against queue depth", ""]
        lines += _claims_table(results.queue)
        lines += ["", *_verdict_line(found, "queue"), claims]
    if results.workspaces:
        lines += ["", "### Workspace axis: the same queue over more open workspaces", ""]
        lines += _claims_table(results.workspaces)
        lines += ["", *_verdict_line(found, "workspaces"), claims]
    if results.leased:
        lines += ["", "### Leased axis: claim cost against runs already leased", ""]
        lines += _claims_table(results.leased)
        lines += ["", *_verdict_line(found, "leased")]
        lines.append(
            f"The leased runs are held by another holder (an hour's lease) before the "
            f"{scale.claims} timed single claims."
        )
    if results.drains:
        lines += ["", "### Drain: the worker loop as ended runs pile up", ""]
        every = [*results.drains, *([] if results.million is None else [results.million])]
        lines += [
            "| runs | prepare (s, untimed) | seconds | runs/s |",
            "| ---: | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {d.runs:,} | {d.prepare_s:.1f} | {d.seconds:.1f} | {d.rate:,.0f} |" for d in every
        ]
        lines += ["", *_verdict_line(found, "drain")]
        lines.append(
            "Each drain on a fresh database: `Worker.run` with 64 slots (batch claims of its free "
            "slots), one step per run, 50 workspaces, 4 runs per subject (`bench.throughput`'s "
            "worker loop), one drain per size, in the order shown."
        )
    if results.snapshot is not None:
        sn = results.snapshot
        lines += ["", "### Snapshot: the worker loop while a REPEATABLE READ snapshot is held", ""]
        lines += [
            "| another session's snapshot | drains (runs/s, in order) | median runs/s |",
            "| --- | --- | ---: |",
        ]
        for side, rates in (("not held", sn.without), ("held for the whole drain", sn.held)):
            shown = ", ".join(f"{rate:,.0f}" for rate in rates)
            lines.append(f"| {side} | {shown} | {statistics.median(rates):,.0f} |")
        lines += ["", *_verdict_line(found, "snapshot")]
        lines.append(
            f"Each drain of {sn.runs:,} runs on a fresh database, prepared and drained as the "
            "drain measure's (`Worker.run`, 64 slots); the two sides alternate, without first. "
            "The holder runs `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM agent_run "
            "LIMIT 1` after the prepare and keeps the transaction open until the drain has "
            "ended (its `backend_xmin` checked set), so none of the dead row versions the drain "
            "leaves can be pruned or vacuumed meanwhile."
        )
    if results.take_backs:
        lines += ["", "### Take-back: expired leases returned by the reaper", ""]
        lines += [
            "| replicas | batch | expired | taken back | seconds | per second "
            "| ticks (all replicas) | lost races | failed |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {t.replicas} | {t.batch} | {t.expired:,} | {t.taken_back:,} | {t.seconds:.2f} "
            f"| {t.rate:,.0f} | {t.ticks} | {t.lost_races} | {t.failed} |"
            for t in results.take_backs
        ]
        lines += ["", *_verdict_line(found, "takeback")]
        lines.append(
            "Each row on a fresh database: the runs leased, their leases expired by one UPDATE, "
            "then `AgentRunReaper.tick` looped by each replica (over the same stores, "
            "concurrently) until the database holds no expired lease."
        )
    if results.renewals is not None:
        r = results.renewals
        group = (
            f"the worker's, groups of up to {_DEFAULT_GROUP}"
            if r.max_group is None
            else f"groups of up to {r.max_group}, not the worker's {_DEFAULT_GROUP}"
        )
        lines += ["", "### Renewals over leased runs", ""]
        lines += [
            "| path | leased runs | renewals per second |",
            "| --- | ---: | ---: |",
            f"| worker group commit (`GroupSettler.step_boundary`) | {r.leased:,} "
            f"| {r.group_per_s:,.0f} |",
            f"| one run at a time (`AgentRuns.renew`, {r.renewers} renewers) | {r.leased:,} "
            f"| {r.one_run_per_s:,.0f} |",
        ]
        lines += ["", *_verdict_line(found, "renewals")]
        lines.append(
            f"Each for {scale.seconds:g} s. The group commit: one `GroupSettler` ({group}), "
            "one task per leased run looping step boundaries; each renews "
            "the lease and persists one event. The one-run path: one transaction per renewal, "
            "the gateway's."
        )
    if results.queue and results.queue[-1].sizes:
        last = results.queue[-1]
        lines += [
            "",
            f"### Sizes at {last.queued:,} queued runs, scaled to one million runs",
            "",
            f"({last.workspaces:,} workspaces, {last.subjects:,} subjects; `agent_workspace` "
            "holds one lane row per workspace.)",
            "",
            "| relation | MiB per million runs |",
            "| --- | ---: |",
        ]
        lines += [
            f"| {name} | {size / last.queued * 1_000_000 / 2**20:,.1f} |"
            for name, size in last.sizes
        ]
    return "\n".join(lines) + "\n"
