"""Provider limits (ADRs/0032) against a fake provider: `python -m bench.limits`.

A fake provider (a small HTTP server process) counts its calls in a sliding 60 s window and
answers 429 past its limit; it logs every call with its time, tokens and answer to
``bench/limits-calls-<case>.csv`` (the evidence). Real agentruns Worker processes on the
embedded PostgreSQL run a kind that declares the limit; each run's step takes from it and then
calls the provider over HTTP. The cases:

- ``rate``: 600 requests/min, 8 worker processes: calls in any 60 s window (at most 600) and
  per minute while work waits (at least 570).
- ``pause``: the provider answers one 429 with ``Retry-After: 30``: calls before the 30 s are up.
- ``tokens``: 1,000,000 tokens/min, steps of 1,000 to 60,000 tokens: tokens in any 60 s window.
- ``claim``: a worker's claim p50 when its kind draws from 100 declared limits against none.
- ``designs``: the shipped token bucket against a sliding-window log (a row per take, the
  limit's row locked, a sum over the window; its SQL is here, not in the library), 8 processes
  taking as fast as they can: take latency p50/p99, the most granted in any period, and
  utilisation.

``--minutes 0.5`` shortens the worker cases, ``--design-seconds`` the designs case; a short run
says what it cannot show (a 60 s window needs 60 s).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import csv
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg

from agentruns.adapters.postgres import PostgresFamily
from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.backoff import Backoff
from agentruns.domain.budgets import Budget
from agentruns.domain.errors import LimitExhausted
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.provider_limits import ProviderLimit
from agentruns.domain.run import AgentRun
from agentruns.domain.usage import Usage
from bench.results import table, write_section
from tests.postgres_server import cloned_database, create_template, server_url

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
LIMIT = "bench/provider"
WINDOW = 60.0
PAUSE_ROW = "after one 429 with `Retry-After: 30`: calls before the 30 s are up"


# --- the fake provider -------------------------------------------------------------------------


class Provider:
    """A sliding 60 s window of calls and tokens; 429 past either limit (Retry-After: the
    seconds until the window has room), or a forced 429 with ``Retry-After: 30`` at call
    ``force_at``. Every call is logged: wall time, tokens, status."""

    def __init__(self, requests: int | None, tokens: int | None, force_at: int, log: Path) -> None:
        self.requests = requests
        self.tokens = tokens
        self.force_at = force_at
        self.calls: deque[tuple[float, int]] = deque()
        self.count = 0
        self.lock = threading.Lock()
        self.log = log.open("w", newline="")
        self.writer = csv.writer(self.log)
        self.writer.writerow(["time", "tokens", "status"])

    def call(self, tokens: int) -> tuple[int, float | None]:
        with self.lock:
            now = time.time()
            while self.calls and self.calls[0][0] <= now - WINDOW:
                self.calls.popleft()
            self.count += 1
            status, retry = 200, None
            used = sum(t for _, t in self.calls)
            if self.count == self.force_at:
                status, retry = 429, 30.0
            elif (self.requests is not None and len(self.calls) + 1 > self.requests) or (
                self.tokens is not None and used + tokens > self.tokens
            ):
                status, retry = 429, max(1.0, self.calls[0][0] + WINDOW - now)
            else:
                self.calls.append((now, tokens))
            self.writer.writerow([f"{now:.6f}", tokens, status])
            self.log.flush()
            return status, retry


def serve_provider(
    port: int, requests: int | None, tokens: int | None, force_at: int, log: Path
) -> None:
    provider = Provider(requests, tokens, force_at, log)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, retry = provider.call(int(body.get("tokens", 0)))
            self.send_response(status)
            if retry is not None:
                self.send_header("Retry-After", str(round(retry)))
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            return

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


# --- the worker process ------------------------------------------------------------------------


class ProviderRefused(Exception):
    """The provider's 429, read by its shape: a status and a response with headers."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"provider answered {response.status_code}")
        self.status_code = response.status_code
        self.response = response


def _limit(requests: int | None, tokens: int | None) -> ProviderLimit:
    return ProviderLimit(LIMIT, requests=requests, tokens=tokens)


def _kind(steps: Any, limits: tuple[str, ...] = (LIMIT,)) -> RunKind:
    policy = RunKindPolicy(
        name="call",
        lease=timedelta(seconds=60),
        retry_budget=50,
        backoff=Backoff(base=timedelta(seconds=1), cap=timedelta(seconds=60), jitter=0.1),
        limits=limits,
    )
    return RunKind(policy, steps)


async def work(args: argparse.Namespace) -> None:
    family = PostgresFamily(args.url, pool_size=4)
    client = httpx.AsyncClient(base_url=args.provider, timeout=30)
    box: list[AgentRuns] = []

    async def steps(run: AgentRun) -> AsyncIterator[StepEvent]:
        tokens = int(run.payload.get("tokens", 0))  # type: ignore[arg-type]
        await box[0].take(LIMIT, requests=1, tokens=tokens, wait=timedelta(minutes=5), poll=0.5)
        response = await client.post("/call", json={"tokens": tokens})
        if response.status_code >= 400:
            raise ProviderRefused(response)
        yield StepEvent("called", {"tokens": tokens})

    kinds = RunKinds([_kind(steps)])
    runs = AgentRuns(family.stores, kinds, random.Random(args.holder))
    box.append(runs)
    await runs.declare_limit(_limit(args.requests, args.tokens))
    worker = Worker(
        runs,
        kinds,
        family.stores.notifier,
        random.Random(args.holder),
        holder=f"bench-{args.holder}",
        concurrency=args.concurrency,
        poll_interval=1.0,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(args.seconds, stop.set)
    try:
        await worker.run(stop, grace=5.0)
    finally:
        await client.aclose()
        await family.close()


# --- the orchestrator --------------------------------------------------------------------------


def _start(args: list[str], log: Path | None = None) -> subprocess.Popen[bytes]:
    out = subprocess.DEVNULL if log is None else log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "bench.limits", *args], cwd=REPO, stdout=out, stderr=out
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _enqueue(url: str, count: int, tokens: tuple[int, int] | None) -> None:
    async def go() -> None:
        family = PostgresFamily(url)
        runs = AgentRuns(family.stores, RunKinds([_kind(_noop)]), random.Random(1))
        rng = random.Random(2)
        try:
            for n in range(count):
                size = 0 if tokens is None else rng.randint(*tokens)
                await runs.enqueue(
                    "call", workspace="bench", subject=f"s{n}", payload={"tokens": size}
                )
        finally:
            await family.close()

    asyncio.run(go())


async def _noop(run: AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("noop", {})


def _calls(log: Path) -> list[tuple[float, int, int]]:
    with log.open() as f:
        return [(float(r["time"]), int(r["tokens"]), int(r["status"])) for r in csv.DictReader(f)]


def _max_window(times: list[float], weights: list[int], window: float) -> int:
    """The most weight in any window of ``window`` seconds starting at a call."""
    best = 0
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    for i, start in enumerate(times):
        j = bisect.bisect_left(times, start + window)
        best = max(best, prefix[j] - prefix[i])
    return best


def _drive(
    server: str,
    case: str,
    options: argparse.Namespace,
    *,
    requests: int | None,
    tokens: int | None,
    sizes: tuple[int, int] | None,
    force_at: int = 0,
) -> list[tuple[float, int, int]]:
    seconds = options.minutes * 60
    log = BENCH / f"limits-calls-{case}.csv"
    with cloned_database(server) as url:
        rate = requests if requests is not None else 100
        _enqueue(url, int(rate * options.minutes * 1.3) + 50, sizes)
        port = _free_port()
        provider = _start(
            [
                "provider",
                "--port",
                str(port),
                "--log",
                str(log),
                "--force-at",
                str(force_at),
                *(["--requests", str(requests)] if requests else []),
                *(["--tokens", str(tokens)] if tokens else []),
            ]
        )
        time.sleep(0.5)
        workers = [
            _start(
                [
                    "worker",
                    "--url",
                    url,
                    "--provider",
                    f"http://127.0.0.1:{port}",
                    "--holder",
                    str(n),
                    "--seconds",
                    str(seconds),
                    "--concurrency",
                    str(options.concurrency),
                    *(["--requests", str(requests)] if requests else []),
                    *(["--tokens", str(tokens)] if tokens else []),
                ],
                BENCH / f"limits-workers-{case}.log",
            )
            for n in range(options.workers)
        ]
        for proc in workers:
            proc.wait(timeout=seconds + 60)
        provider.terminate()
        provider.wait()
    return _calls(log)


def rate_case(server: str, options: argparse.Namespace) -> list[str]:
    calls = _drive(server, "rate", options, requests=600, tokens=None, sizes=None)
    ok = [t for t, _, s in calls if s == 200]
    refused = sum(1 for _, _, s in calls if s != 200)
    peak = _max_window(ok, [1] * len(ok), WINDOW)
    span = ok[-1] - ok[0] if len(ok) > 1 else 0.0
    # Per full minute after the first call (the bucket starts with one second's burst).
    minutes = [
        sum(1 for t in ok if ok[0] + m * 60 <= t < ok[0] + (m + 1) * 60)
        for m in range(int(span // 60))
    ]
    steady = min(minutes) if minutes else round(len(ok) / span * 60) if span else 0
    what = "per full minute (min)" if minutes else f"rate over {span:.0f} s, per minute (short run)"
    print(
        f"rate: {len(ok)} calls, {refused} refused, peak 60 s window {peak}, {what} {steady}",
        flush=True,
    )
    return [
        f"| 600 requests/min, {options.workers} worker processes, {options.minutes:g} min: "
        "calls in "
        f"any 60 s window | ≤ 600 | **{peak}** ({refused} answered 429) |",
        f"| the same: calls {what} while work waits | ≥ 570 | **{steady}** |",
    ]


def pause_case(server: str, options: argparse.Namespace) -> list[str]:
    calls = _drive(server, "pause", options, requests=600, tokens=None, sizes=None, force_at=50)
    forced = [t for t, _, s in calls if s == 429]
    if not forced:
        return [f"| {PAUSE_ROW} | 0 | **no 429 seen** |"]
    at = forced[0]
    early = sum(1 for t, _, _ in calls if at < t < at + 30)
    after = [t for t, _, _ in calls if t >= at + 30]
    resumed = f", first call {after[0] - at:.2f} s after" if after else ""
    print(f"pause: {early} calls within 30 s of the 429{resumed}", flush=True)
    return [f"| {PAUSE_ROW} | 0 | **{early}**{resumed} |"]


def tokens_case(server: str, options: argparse.Namespace) -> list[str]:
    sizes = (1_000, 60_000)
    calls = _drive(server, "tokens", options, requests=None, tokens=1_000_000, sizes=sizes)
    ok = [(t, k) for t, k, s in calls if s == 200]
    peak = _max_window([t for t, _ in ok], [k for _, k in ok], WINDOW)
    biggest = max((k for _, k in ok), default=0)
    print(
        f"tokens: {len(ok)} calls, peak 60 s window {peak:,} tokens (largest step {biggest:,})",
        flush=True,
    )
    return [
        f"| 1,000,000 tokens/min, steps of {sizes[0]:,} to {sizes[1]:,} tokens: tokens in any "
        "60 s window "
        f"| ≤ 1,000,000 (+1 step) | **{peak:,}** (largest step {biggest:,}) |"
    ]


def claim_case(server: str, options: argparse.Namespace) -> list[str]:
    """Two databases populated alike (runs in 1,000 workspaces): in one, 100 limits declared and
    every workspace with a budget (a tenth of them spent, so held by their budget); in the other
    neither. Rounds alternate between them (15 claims of one run each), so the machine's drift
    falls on both; the worker whose kind draws from all 100 limits, and from one, against the
    worker whose kind draws from none."""
    names = tuple(f"provider-{n}" for n in range(100))
    workspaces = 1_000

    async def spend(run: AgentRun) -> AsyncIterator[StepEvent]:
        usage = Usage(input_tokens=10, provider="p", model="m") if run.payload else None
        yield StepEvent("spent", {}, usage=usage)

    async def populate(url: str, limited: bool) -> None:
        # One kind on both sides (a kind the claiming worker does not run would turn its claim
        # into the claim of some kinds on one side only): the runs that spend are driven first.
        family = PostgresFamily(url)
        kinds = RunKinds([_kind(spend, limits=())])
        runs = AgentRuns(family.stores, kinds, random.Random(1))
        try:
            if limited:
                for name in names:
                    await runs.declare_limit(ProviderLimit(name, requests=10**9, tokens=10**12))
                for n in range(workspaces):
                    await runs.set_budget(Budget(f"w{n}", tokens=5 if n % 10 == 0 else 10**12))
            for n in range(0, workspaces, 10):
                await runs.enqueue(
                    "call", workspace=f"w{n}", subject=f"spend-{n}", payload={"spend": limited}
                )
            worker = Worker(runs, kinds, family.stores.notifier, random.Random(2), holder="spender")
            while await worker.claim_and_drive(64):
                pass
            held = 0
            for n in range(0, workspaces, 10):
                view = await runs.budget(f"w{n}")
                held += view is not None and view.held_until is not None
            print(f"claim: {held} workspaces held by their budget", flush=True)
            for n in range(options.claim_rounds * 30 * 2 + workspaces):
                await runs.enqueue("call", workspace=f"w{n % workspaces}", subject=f"s{n}")
        finally:
            await family.close()

    async def go(plain_url: str, limited_url: str) -> dict[str, float]:
        await populate(plain_url, limited=False)
        await populate(limited_url, limited=True)
        plain_family, limited_family = PostgresFamily(plain_url), PostgresFamily(limited_url)
        try:
            workers = {}
            for label, family, draws in (
                ("none", plain_family, ()),
                ("all", limited_family, names),
                ("one", limited_family, names[:1]),
            ):
                k = RunKinds([_kind(_noop, limits=draws)])
                workers[label] = Worker(
                    AgentRuns(family.stores, k, random.Random(2)),
                    k,
                    family.stores.notifier,
                    random.Random(3),
                    holder=label,
                )
            seen: dict[str, list[float]] = {label: [] for label in workers}
            for r in range(options.claim_rounds):
                order = list(workers) if r % 2 == 0 else list(reversed(workers))
                for label in order:
                    for _ in range(15):
                        started = time.perf_counter()
                        claimed = await workers[label]._claim_now(1)
                        seen[label].append(time.perf_counter() - started)
                        assert len(claimed) == 1, f"the {label} claim found no run"
            return {label: statistics.median(times) for label, times in seen.items()}
        finally:
            await plain_family.close()
            await limited_family.close()

    with cloned_database(server) as plain_url, cloned_database(server) as limited_url:
        p50 = asyncio.run(go(plain_url, limited_url))
    rows = []
    # The target's case: a kind draws from its provider's limit among the 100 declared. A kind
    # drawing from all 100 is a stress case beyond it (each claim reads 100 buckets), reported
    # without a target (ADRs/0032 names its next lever).
    for label, what, target in (
        ("one", "one of them", "≤ 1.2x"),
        ("all", "all 100", "— (stress, beyond the target)"),
    ):
        ratio = p50[label] / p50["none"]
        print(
            f"claim p50: none {p50['none'] * 1000:.2f} ms, drawing from {what} "
            f"{p50[label] * 1000:.2f} ms ({ratio:.2f}x)",
            flush=True,
        )
        rows.append(
            f"| claim p50 with 100 limits declared (the kind draws from {what}) and 1,000 "
            f"workspaces with budgets (100 of them spent, held) vs none, {options.claim_rounds} "
            f"alternating rounds of 15 claims | {target} | **{ratio:.2f}x** "
            f"({p50[label] * 1000:.2f} vs {p50['none'] * 1000:.2f} ms) |"
        )
    return rows


# --- the second design, measured here only: a sliding-window log -------------------------------

WINDOW_DDL = """
CREATE TABLE IF NOT EXISTS bench_window (name text PRIMARY KEY, requests bigint NOT NULL,
                                         per_seconds double precision NOT NULL);
CREATE TABLE IF NOT EXISTS bench_window_take (name text NOT NULL, at timestamptz NOT NULL,
                                              requests bigint NOT NULL);
CREATE INDEX IF NOT EXISTS bench_window_take_at ON bench_window_take (name, at);
"""
# Two statements in one transaction: the lock first, so that the sum that follows reads every
# take committed before it (one statement's snapshot would predate its wait for the lock).
WINDOW_LOCK = "SELECT requests, per_seconds FROM bench_window WHERE name = %(name)s FOR UPDATE"
WINDOW_TAKE = """
INSERT INTO bench_window_take (name, at, requests)
SELECT %(name)s, clock_timestamp(), 1
WHERE (SELECT COALESCE(sum(requests), 0) FROM bench_window_take
       WHERE name = %(name)s AND at > clock_timestamp() - make_interval(secs => %(per)s))
      + 1 <= %(limit)s
RETURNING 1
"""


async def take_loop(args: argparse.Namespace) -> None:
    """One process of the designs case: takes for ``seconds``, writing (time, granted, latency)."""
    out = Path(args.out).open("w")  # noqa: ASYNC230, SIM115 - the loop's lifetime, before it
    deadline = time.time() + args.seconds
    if args.store == "bucket":
        family = PostgresFamily(args.url, pool_size=2)
        runs = AgentRuns(family.stores, RunKinds([]), random.Random(1))
        while time.time() < deadline:
            started = time.perf_counter()
            try:
                await runs.take("design", wait=timedelta(0))
                granted = 1
            except LimitExhausted:
                granted = 0
            out.write(f"{time.time():.6f},{granted},{time.perf_counter() - started:.6f}\n")
        await family.close()
    else:
        async with await psycopg.AsyncConnection.connect(args.url, autocommit=False) as conn:
            while time.time() < deadline:
                started = time.perf_counter()
                async with conn.transaction():
                    row = await (await conn.execute(WINDOW_LOCK, {"name": "design"})).fetchone()
                    assert row is not None
                    params = {"name": "design", "per": row[1], "limit": row[0]}
                    granted = 1 if await (await conn.execute(WINDOW_TAKE, params)).fetchone() else 0
                out.write(f"{time.time():.6f},{granted},{time.perf_counter() - started:.6f}\n")
    out.close()


def designs_case(server: str, options: argparse.Namespace) -> list[str]:
    period = options.design_period
    limit = 600
    rows = []
    for design in ("bucket", "window"):
        with cloned_database(server) as url:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(WINDOW_DDL)
                conn.execute("INSERT INTO bench_window VALUES ('design', %s, %s)", (limit, period))

            async def declare(url: str = url) -> None:
                family = PostgresFamily(url)
                runs = AgentRuns(family.stores, RunKinds([]), random.Random(1))
                await runs.declare_limit(
                    ProviderLimit("design", requests=limit, per=timedelta(seconds=period))
                )
                await family.close()

            asyncio.run(declare())
            outs = [BENCH / f".limits-design-{design}-{n}.csv" for n in range(options.workers)]
            procs = [
                _start(
                    [
                        "take",
                        "--url",
                        url,
                        "--store",
                        design,
                        "--seconds",
                        str(options.design_seconds),
                        "--out",
                        str(out),
                    ],
                    BENCH / "limits-workers-designs.log",
                )
                for out in outs
            ]
            for proc in procs:
                proc.wait(timeout=options.design_seconds + 60)
            samples = []
            for out in outs:
                for line in out.read_text().splitlines():
                    t, g, lat = line.split(",")
                    samples.append((float(t), int(g), float(lat)))
                out.unlink()
        samples.sort()
        latencies = sorted(lat for _, _, lat in samples)
        p50 = latencies[len(latencies) // 2] * 1000
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
        granted = [t for t, g, _ in samples if g]
        peak = _max_window(granted, [1] * len(granted), period)
        span = options.design_seconds
        utilisation = len(granted) / (limit * span / period)
        print(
            f"{design}: {len(samples)} takes, p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
            f"peak {peak}/{limit} "
            f"per {period:g} s, utilisation {utilisation:.0%}",
            flush=True,
        )
        rows.append(
            f"| {design} ({'shipped' if design == 'bucket' else 'measured only'}): "
            f"{options.workers} processes taking for {span:g} s, {limit}/{period:g} s | — | "
            f"take p50 **{p50:.2f} ms**, p99 **{p99:.2f} ms**; most in one period **{peak}**; "
            f"utilisation **{utilisation:.0%}** |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role")
    provider = sub.add_parser("provider")
    provider.add_argument("--port", type=int, required=True)
    provider.add_argument("--requests", type=int)
    provider.add_argument("--tokens", type=int)
    provider.add_argument("--force-at", type=int, default=0)
    provider.add_argument("--log", type=Path, required=True)
    worker = sub.add_parser("worker")
    worker.add_argument("--url", required=True)
    worker.add_argument("--provider", required=True)
    worker.add_argument("--holder", type=int, required=True)
    worker.add_argument("--seconds", type=float, required=True)
    worker.add_argument("--concurrency", type=int, default=2)
    worker.add_argument("--requests", type=int)
    worker.add_argument("--tokens", type=int)
    take = sub.add_parser("take")
    take.add_argument("--url", required=True)
    take.add_argument("--store", choices=("bucket", "window"), required=True)
    take.add_argument("--seconds", type=float, required=True)
    take.add_argument("--out", required=True)
    parser.add_argument("--minutes", type=float, default=5.0, help="each worker case's length")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=2, help="runs in flight per worker")
    parser.add_argument("--claim-rounds", type=int, default=41)
    parser.add_argument("--design-seconds", type=float, default=120.0)
    parser.add_argument("--design-period", type=float, default=60.0)
    parser.add_argument(
        "--only", choices=("rate", "pause", "tokens", "claim", "designs"), action="append"
    )
    parser.add_argument("--no-results", action="store_true")
    options = parser.parse_args()
    if options.role == "provider":
        serve_provider(
            options.port, options.requests, options.tokens, options.force_at, options.log
        )
        return
    if options.role == "worker":
        asyncio.run(work(options))
        return
    if options.role == "take":
        asyncio.run(take_loop(options))
        return
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    started = datetime.now(UTC)
    cases = options.only or ["rate", "pause", "tokens", "claim", "designs"]
    rows: list[str] = []
    with server_url() as server:
        create_template(server)
        for case, run in (
            ("rate", rate_case),
            ("pause", pause_case),
            ("tokens", tokens_case),
            ("claim", claim_case),
            ("designs", designs_case),
        ):
            if case in cases:
                rows.extend(run(server, options))
    text = table("## Provider limits (`python -m bench.limits`)", started, rows)
    print(text)
    if not options.no_results:
        write_section("limits", text)


if __name__ == "__main__":
    main()
