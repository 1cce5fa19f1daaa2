"""The PostgreSQL our users run: the same drain and the same claims on the embedded server and on
another one (Debian's packaged server with its default settings, JIT on), in one run.

    python -m bench.servers --url postgresql://role:password@127.0.0.1:5433/postgres

For each server, alternating: a drain of ``--runs`` runs (200) by one worker loop, each drain on
a fresh database migrated to head, ``--repeats`` times; then ``make depth``'s workspace axis
(the claim's p50/p99 on the same queue over 10, 1,000 and 10,000 open workspaces) at the quick
scale. With ``--jit-as-before`` the other server also drains a database whose functions run with
the server's own JIT setting, as before revision 0015, to show what that revision changed.
Writes the ``servers``
section of ``bench/RESULTS.md``; the targets: the other server's drain within 1.5x the
embedded server's, and a flat workspace axis on each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import sys
import time
from datetime import UTC, datetime

import psycopg

from bench import depth
from bench.results import write_section
from bench.server import BenchServer, bench_server
from bench.throughput import agentruns_runner

# The functions 0015 set jit = off on, and the settings they keep without it.
_JIT_AS_BEFORE = """
ALTER FUNCTION agent_claim(timestamptz, interval, text, integer, boolean) RESET jit;
ALTER FUNCTION guard_agent_run_event_insert() RESET jit;
ALTER FUNCTION agent_lane_fold() RESET jit;
ALTER FUNCTION agent_run_inserted() RESET jit;
ALTER FUNCTION agent_run_moved() RESET jit;
ALTER FUNCTION agent_run_gone() RESET jit;
ALTER FUNCTION guard_agent_run_event_delete() RESET jit;
"""


async def _drain(server: BenchServer, runs: int, jit_as_before: bool = False) -> float:
    url = server.create_database("servers")
    try:
        await agentruns_runner.prepare(url, runs)
        if jit_as_before:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(_JIT_AS_BEFORE)
        done, seconds = await agentruns_runner.drain_worker_loop(url, concurrency=16)
    finally:
        server.drop_database(url)
    if done != runs:
        raise RuntimeError(f"the worker loop drained {done} of {runs} runs")
    return seconds


def _describe(server: BenchServer) -> str:
    with psycopg.connect(server.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('jit'), "
            "pg_jit_available(), current_setting('jit_above_cost')"
        ).fetchone()
    assert row is not None
    version, jit, available, above = row
    shown = "yes" if available else "no"
    return f"PostgreSQL {version}, jit {jit} (available: {shown}, above cost {above})"


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


async def measure(
    embedded: BenchServer, other: BenchServer, runs: int, repeats: int, jit_as_before: bool
) -> tuple[dict[str, list[float]], dict[str, list[depth.ClaimPoint]]]:
    drains: dict[str, list[float]] = {"embedded": [], "other": []}
    before = "other, functions with the server's JIT setting (as before 0015)"
    if jit_as_before:
        drains[before] = []
    for round_ in range(repeats):
        for name, server in (("embedded", embedded), ("other", other)):
            seconds = await _drain(server, runs)
            drains[name].append(seconds)
            print(f"drain {round_ + 1}: {name} {runs} runs in {seconds:.2f}s", flush=True)
    if jit_as_before:
        seconds = await _drain(other, runs, jit_as_before=True)
        drains[before].append(seconds)
        print(f"drain: {before}: {runs} runs in {seconds:.2f}s", flush=True)
    scale = depth.SCALES["quick"]
    axes = {
        "embedded": await depth.workspace_axis(embedded, scale),
        "other": await depth.workspace_axis(other, scale),
    }
    return drains, axes


def render(
    drains: dict[str, list[float]],
    axes: dict[str, list[depth.ClaimPoint]],
    *,
    servers: dict[str, str],
    runs: int,
    command: str,
    started: datetime,
    load: tuple[str, str],
) -> str:
    base = statistics.median(drains["embedded"])
    other = statistics.median(drains["other"])
    ratio = other / base
    lines = [
        "## Servers: the same drain and claims on the embedded and a packaged PostgreSQL",
        "",
        f"- Command: `{command}`, {started:%Y-%m-%d %H:%M} UTC; load average {load[0]} before, "
        f"{load[1]} after (2 cores).",
        f"- embedded: {servers['embedded']}.",
        f"- other: {servers['other']}.",
        "",
        "| target | measured | met |",
        "| --- | ---: | :---: |",
        f"| a drain of {runs} runs on the other server within 1.5x the embedded server's "
        f"| {ratio:.2f}x | {'yes' if ratio <= 1.5 else '**no**'} |",
    ]
    for name, points in axes.items():
        spread = points[-1].single[0] / points[0].single[0]
        met = "yes" if spread <= 2 else "**no**"
        lines.append(
            f"| {name}: claim p50 at {points[-1].workspaces:,} open workspaces within 2x the "
            f"p50 at {points[0].workspaces:,} | {spread:.2f}x | {met} |"
        )
    lines += [
        "",
        f"### A drain of {runs} runs by one worker loop (16 slots), fresh database each",
        "",
        "| server | median s | min - max s | runs/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, seconds in drains.items():
        median = statistics.median(seconds)
        lines.append(
            f"| {name} | {median:.2f} | {min(seconds):.2f} - {max(seconds):.2f} "
            f"| {runs / median:,.0f} |"
        )
    for name, points in axes.items():
        lines += [
            "",
            f"### {name}: the workspace axis (the quick scale of `make depth`)",
            "",
            "| queued runs | open workspaces | claim p50 ms | claim p99 ms |",
            "| ---: | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {p.queued:,} | {p.workspaces:,} | {p.single[0]:.2f} | {p.single[1]:.2f} |"
            for p in points
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.servers", description=__doc__)
    parser.add_argument("--url", required=True, help="the other server's admin URL")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--jit-as-before", action="store_true", help="also drain with 0015's jit = off undone"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    started = datetime.now(UTC)
    load_before = _load()
    with bench_server() as embedded, bench_server(args.url) as other:
        servers = {"embedded": _describe(embedded), "other": _describe(other)}
        t0 = time.perf_counter()
        measured = measure(embedded, other, args.runs, args.repeats, args.jit_as_before)
        drains, axes = asyncio.run(measured)
        print(f"measured in {time.perf_counter() - t0:.0f}s", flush=True)
    shown = [arg for arg in (sys.argv[1:] if argv is None else argv) if arg != "--no-write"]
    shown = ["--url", "URL" if "--url" in shown else ""] + [
        a for i, a in enumerate(shown) if a != "--url" and (i == 0 or shown[i - 1] != "--url")
    ]
    text = render(
        drains,
        axes,
        servers=servers,
        runs=args.runs,
        command=shlex.join(["python", "-m", "bench.servers", *shown]),
        started=started,
        load=(load_before, _load()),
    )
    print(text)
    if not args.no_write:
        write_section("servers", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
