"""``python -m bench.steps``: what recorded steps cost the worker loop, and what the plain loop
lost since a base revision (issue 23's first two rows).

Both rows are alternating drains of one worker loop (64 slots) on fresh databases of one server,
each drain in a process of its own, so neither side warms the other's caches:

- **recorded**: the loop with one recorded step per run (``ctx.step`` of a function returning
  ``{}``) against the same loop with one plain step event (the throughput bench's kind), this
  tree's code for both. Target ≥ 0.85x.
- **regression**: the plain loop of this tree against the plain loop of ``--base`` (a git
  revision, checked out in a temporary worktree and run with this environment's packages, so
  only the code differs). Target ≥ 0.95x.

Each drain reports its runs/s and the worker process's CPU per run (user + system, the loop's
own share: the figure that wall-clock noise moves least). Medians are compared; the load
average is printed with every drain. Run it alone: the machine has two cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.results import write_section
from bench.server import BenchServer, bench_server

REPO = Path(__file__).resolve().parents[1]

# One drain, in a child process whose sys.path starts with the tree under test. It uses only what
# every revision since the worker loop has: ``prepare`` and ``drain_worker_loop``.
CHILD = """
import asyncio, json, sys, time
from bench.throughput import agentruns_runner as runner
url, runs, step = sys.argv[1], int(sys.argv[2]), sys.argv[3]
options = {}
if step == "recorded":
    import agentruns

    async def nothing() -> dict:
        return {}

    async def recorded(run, ctx):
        await ctx.step("step", nothing)

    options["step"] = agentruns.RecordedSteps(recorded)
elif step == "usage":
    import agentruns
    from decimal import Decimal

    SPENT = agentruns.Usage(
        input_tokens=1200, output_tokens=300, cost=Decimal("0.0042"),
        provider="openai", model="gpt-5",
    )

    async def spending(run):
        yield agentruns.StepEvent("step", {}, usage=SPENT)

    options["step"] = spending

async def main():
    await runner.prepare(url, runs)
    cpu = time.process_time()
    done, seconds = await runner.drain_worker_loop(url, concurrency=64, **options)
    cpu = time.process_time() - cpu
    print(json.dumps({"done": done, "seconds": seconds, "cpu": cpu}))

asyncio.run(main())
"""


@dataclass
class Side:
    label: str
    tree: Path
    step: str
    rates: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)

    def median_rate(self) -> float:
        return statistics.median(self.rates)

    def median_cpu(self) -> float:
        return statistics.median(self.cpu_us)


def drain(url: str, side: Side, runs: int) -> None:
    """One drain of ``side`` on the empty database ``url``."""
    env = dict(os.environ, PYTHONPATH=f"{side.tree / 'src'}{os.pathsep}{side.tree}")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(runs), side.step],
        cwd=side.tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"a drain of {side.label} failed:\n{done.stderr[-2000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    rate = figures["done"] / figures["seconds"]
    cpu = figures["cpu"] / figures["done"] * 1e6
    side.rates.append(rate)
    side.cpu_us.append(cpu)
    load = os.getloadavg()[0]
    print(f"  {side.label:<22} {rate:7.0f} runs/s  {cpu:6.1f} µs CPU/run  load {load:.2f}")


def compare(server: BenchServer, a: Side, b: Side, rounds: int, runs: int) -> None:
    """Alternating drains, a then b, then b then a, ``rounds`` pairs."""
    for number in range(rounds):
        for side in (a, b) if number % 2 == 0 else (b, a):
            url = server.create_database("steps")
            try:
                drain(url, side, runs)
            finally:
                server.drop_database(url)


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """``revision`` checked out in a temporary worktree, removed when the block ends."""
    place = Path(tempfile.mkdtemp(prefix="agentruns-base-"))
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(place), revision],
        check=True,
        capture_output=True,
    )
    try:
        yield place
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(place)],
            check=False,
            capture_output=True,
        )


def loop_row(base_revision: str, rounds: int, runs: int, *, what: str, before: str) -> str:
    """The plain worker loop of this tree against ``base_revision``'s (``before`` says what
    that revision lacks), ``rounds`` alternating drains of ``runs`` runs on a server of its
    own: a RESULTS row of (measure, target ≥ 0.95x, measured)."""
    with bench_server(None) as server, worktree(base_revision) as base_tree:
        print(f"loop: the plain worker loop of this tree vs {base_revision}'s")
        today = Side("this tree, plain", REPO, "plain")
        base = Side(f"{base_revision}, plain", base_tree, "plain")
        compare(server, today, base, rounds, runs)
    ratio = today.median_rate() / base.median_rate()
    return (
        f"| {what} vs {base_revision} ({before}), {rounds} alternating drains of {runs:,} runs "
        f"| ≥ 0.95x | **{ratio:.2f}x** ({today.median_rate():,.0f} vs "
        f"{base.median_rate():,.0f} runs/s; worker CPU {today.median_cpu():.0f} vs "
        f"{base.median_cpu():.0f} µs/run) |"
    )


def row(name: str, target: str, a: Side, b: Side) -> str:
    ratio = a.median_rate() / b.median_rate()
    return (
        f"| {name} | {a.median_rate():,.0f} vs {b.median_rate():,.0f} | **{ratio:.2f}x** "
        f"| {target} | {a.median_cpu():.0f} vs {b.median_cpu():.0f} µs |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20_000, help="runs per drain")
    parser.add_argument("--rounds", type=int, default=6, help="drains per side")
    parser.add_argument("--base", default="d86fc59", help="the revision the plain loop is held to")
    parser.add_argument("--url", help="a server (default: AGENTRUNS_DATABASE_URL, else embedded)")
    parser.add_argument("--only", choices=("recorded", "regression"), help="one row")
    parser.add_argument("--no-results", action="store_true", help="do not write RESULTS.md")
    args = parser.parse_args()
    started = datetime.now(UTC)
    lines: list[str] = []
    with bench_server(args.url) as server:
        if args.only != "regression":
            print("recorded: one recorded step per run vs one plain step event")
            recorded = Side("one recorded step", REPO, "recorded")
            plain = Side("one plain step event", REPO, "plain")
            compare(server, recorded, plain, args.rounds, args.runs)
            lines.append(row("one recorded step vs one plain step", "≥ 0.85x", recorded, plain))
        if args.only != "recorded":
            with worktree(args.base) as base_tree:
                print(f"regression: the plain loop of this tree vs {args.base}'s")
                today = Side("this tree, plain", REPO, "plain")
                base = Side(f"{args.base}, plain", base_tree, "plain")
                compare(server, today, base, args.rounds, args.runs)
                lines.append(row(f"plain loop vs {args.base}'s", "≥ 0.95x", today, base))
        version = server.version()
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    text = "\n".join(
        [
            "## Recorded steps and the plain loop (`python -m bench.steps`)",
            "",
            f"{started:%Y-%m-%d %H:%M} UTC, {version.split(' on ')[0]}, {args.rounds} alternating "
            f"drains of {args.runs:,} runs per side (one worker loop, 64 slots, each drain in "
            f"its own process); load average at the end {load}.",
            "",
            "| row | median runs/s | ratio | target | worker CPU per run |",
            "| --- | ---: | ---: | ---: | ---: |",
            *lines,
        ]
    )
    print(text)
    if not args.no_results:
        write_section("steps", text)


if __name__ == "__main__":
    main()
