"""``python -m bench.usage``: what reporting usage on every step costs the worker loop (issue 26:
at least 0.9x).

    .venv/bin/python -m bench.usage [--rounds 14] [--runs 20000] [--no-results]

Alternating drains of one worker loop (64 slots) on fresh databases of one server, each drain in
a process of its own (:mod:`bench.steps`' method): runs of one step that reports what it spent
(input and output tokens, a cost, a provider and a model: the step boundary's statement also adds
to the run's totals and writes the ledger's row) against runs of one plain step, this tree's
code for both; then the plain loop against ``--base``'s (the tree before issue 26: a step
without usage must cost what it did). No workspace has a budget (a budget's row is charged only
where one is set).
Medians of runs/s and of the worker process's CPU per run are compared; the section ``usage``
of ``bench/RESULTS.md`` is rewritten unless ``--no-results``. Run it alone: two cores.
"""

from __future__ import annotations

import argparse
import os
from datetime import UTC, datetime

from bench.results import table, write_section
from bench.server import bench_server
from bench.steps import REPO, Side, compare, loop_row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20_000, help="runs per drain")
    parser.add_argument("--rounds", type=int, default=14, help="drains per side")
    parser.add_argument("--base", default="3e0e67c", help="the tree before issue 26")
    parser.add_argument("--url", help="a server (default: AGENTRUNS_DATABASE_URL, else embedded)")
    parser.add_argument("--no-results", action="store_true", help="do not write RESULTS.md")
    args = parser.parse_args()
    started = datetime.now(UTC)
    with bench_server(args.url) as server:
        print("usage: one step reporting usage per run vs one plain step")
        spending = Side("one step with usage", REPO, "usage")
        plain = Side("one plain step", REPO, "plain")
        compare(server, spending, plain, args.rounds, args.runs)
    ratio = spending.median_rate() / plain.median_rate()
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    row = (
        f"| worker loop with usage reported on every step vs without, {args.rounds} alternating "
        f"drains of {args.runs:,} runs (load at the end {load}) | ≥ 0.9x | **{ratio:.2f}x** "
        f"({spending.median_rate():,.0f} vs {plain.median_rate():,.0f} runs/s; worker CPU "
        f"{spending.median_cpu():.0f} vs {plain.median_cpu():.0f} µs/run) |"
    )
    regression = loop_row(
        args.base, args.rounds, args.runs, what="worker loop, no usage,", before="before issue 26"
    )
    text = table("## Usage on every step (`python -m bench.usage`)", started, [row, regression])
    print(text)
    if not args.no_results:
        write_section("usage", text)


if __name__ == "__main__":
    main()
