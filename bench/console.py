"""How long the console's pages take to render on the server with a large runs table (ADRs/0018).

    .venv/bin/python -m bench.console [--runs 1000000] [--repeat 15]

One fresh database on the embedded server (or AGENTRUNS_DATABASE_URL's): ``--runs`` runs over
1,000 workspaces and 100,000 subjects, as a busy week leaves them: 2% queued, 500 leased, the
rest ended over seven days (a hundredth of them in the last hour; 2% dead letters, each with a
failure record), filled by ``INSERT ... SELECT generate_series`` with the run triggers off, then
ANALYZE and VACUUM (as autovacuum would have). Then each page is requested through the console's
ASGI app in this process (no network, no browser): the time from request to the last byte of the
answer, which is the server's render time (its queries, the template). Target: every page's
median within 300 ms at 1,000,000 runs. Figures go to stdout with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from datetime import UTC, datetime

import httpx
import psycopg

import agentruns
from bench.population import BOOKKEEPING, HEADS
from bench.results import write_section
from bench.server import bench_server
from tests.browser.kinds import KINDS

FILL = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt, seq,
                       enqueued_at, due_at, lease, leased_until, holder, end_reason, ended_at,
                       claimed_at, last_error_type, last_error, last_failure_class, head)
SELECT gen_random_uuid(),
       (ARRAY['drain', 'flaky', 'dead', 'long'])[1 + g %% 4],
       'ws-' || (g %% 100000) %% 1000,
       'subject-' || g %% 100000,
       g %% 3,
       jsonb_build_object('document', 'doc-' || g, 'words', g %% 977),
       s.state,
       CASE WHEN s.state = 'queued' THEN 0 ELSE 1 END,
       0,
       nextval('agent_run_seq'),
       s.at - interval '30 seconds',
       s.at - interval '20 seconds',
       interval '30 seconds',
       CASE WHEN s.state = 'leased' THEN now() + interval '20 seconds' END,
       CASE WHEN s.state = 'leased' THEN 'bench-worker' END,
       CASE WHEN s.state = 'ended' THEN
            CASE WHEN g %% 50 = 0 THEN 'not_retryable' ELSE 'completed' END END,
       CASE WHEN s.state = 'ended' THEN s.at END,
       CASE WHEN s.state <> 'queued' THEN s.at - interval '10 seconds' END,
       CASE WHEN s.state = 'ended' AND g %% 50 = 0 THEN 'ProviderError' END,
       CASE WHEN s.state = 'ended' AND g %% 50 = 0 THEN 'the API key was revoked' END,
       CASE WHEN s.state = 'ended' AND g %% 50 = 0 THEN 'auth' END,
       s.state = 'leased'
FROM generate_series(1, %(count)s) AS g,
LATERAL (SELECT CASE WHEN g %% 50 = 1 THEN 'queued'
                     WHEN g <= %(leased)s * 50 AND g %% 50 = 2 THEN 'leased'
                     ELSE 'ended' END AS state,
                CASE WHEN g %% 100 = 3 THEN now() - make_interval(secs => g %% 3600)
                     ELSE now() - make_interval(secs => 3600 + g %% (7 * 86400)) END AS at) s
"""

FAILURES = """
INSERT INTO agent_run_failure (run_id, epoch, attempt, holder, error_type, message,
                               failure_class, traceback, recorded_at)
SELECT id, epoch, attempt, 'bench-worker', last_error_type, last_error, last_failure_class,
       'Traceback (most recent call last): ...', ended_at
FROM agent_run WHERE last_error_type IS NOT NULL
"""

EVENTS = """
INSERT INTO agent_run_event (run_id, seq, epoch, type, data, created_at)
SELECT id, n, 1, 'step', jsonb_build_object('index', n), COALESCE(ended_at, now())
FROM (SELECT id, ended_at FROM agent_run WHERE state = 'ended' ORDER BY seq DESC LIMIT 2000) r,
     generate_series(1, 5) AS n
"""


def populate(url: str, runs: int) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        with connection.transaction():
            connection.execute("ALTER TABLE agent_run DISABLE TRIGGER USER")
            connection.execute("ALTER TABLE agent_run_event DISABLE TRIGGER USER")
            connection.execute(FILL, {"count": runs, "leased": 500})
            connection.execute(FAILURES)
            connection.execute(EVENTS)
            connection.execute(HEADS)
            connection.execute("ALTER TABLE agent_run ENABLE TRIGGER USER")
            connection.execute("ALTER TABLE agent_run_event ENABLE TRIGGER USER")
            # The lanes the triggers would have kept (bench/population.py's way).
            connection.execute(BOOKKEEPING)
        # Where the reaper leaves ended runs (ADRs/0035): the console reads them there.
        connection.execute("SELECT agent_run_archive(NULL)")
        connection.execute("VACUUM ANALYZE")


async def measure(url: str, repeat: int) -> list[tuple[str, float, float, float]]:
    """Per page: (name, median ms, p95 ms, KiB)."""
    measured: list[tuple[str, float, float, float]] = []
    async with agentruns.connect(url, kinds=KINDS) as client:
        [dead] = (await client.runs.list_runs(reason="not_retryable", limit=1)).runs
        [event_run] = (await client.runs.list_runs(state="ended", limit=1)).runs
        second = (await client.runs.list_runs(limit=50)).next_cursor
        pages = {
            "overview": "/",
            "overview (live part)": "/live/overview",
            "workspaces": "/workspaces",
            "workspaces by leased share": "/workspaces?sort=share&desc=1",
            "runs": "/runs",
            "runs, second page": f"/runs?cursor={second}",
            "runs of a workspace": f"/runs?workspace={dead.workspace}",
            "runs of a subject": f"/runs?workspace={dead.workspace}&subject={dead.subject}",
            "dead letters": "/runs?reason=not_retryable",
            "queued runs": "/runs?state=queued",
            "runs of a kind": "/runs?kind=flaky",
            "runs of a band, last hour": "/runs?band=background&after=1h",
            "a dead letter's page": f"/runs/{dead.id}",
            "a run with events": f"/runs/{event_run.id}",
            "schedules": "/schedules",
        }
        app = agentruns.create_console(client)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            for name, path in pages.items():
                await http.get(path)  # warm: the pool's connections and the statements
                times = []
                for _ in range(repeat):
                    began = time.perf_counter()
                    answer = await http.get(path)
                    times.append((time.perf_counter() - began) * 1000)
                    if answer.status_code != 200:
                        raise SystemExit(f"{name}: {answer.status_code} {answer.text[:300]}")
                times.sort()
                p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
                verdict = "ok" if statistics.median(times) <= 300 else "OVER 300 ms"
                kib = len(answer.content) / 1024
                measured.append((name, statistics.median(times), p95, kib))
                print(
                    f"{name:<28} median {statistics.median(times):8.1f} ms  p95 {p95:8.1f} ms"
                    f"  {kib:6.0f} KiB  {verdict}",
                    flush=True,
                )
    return measured


def render(
    measured: list[tuple[str, float, float, float]], runs: int, repeat: int, loads: list[str]
) -> str:
    worst = max(median for _, median, _, _ in measured)
    met = "met" if worst <= 300 else "**missed**"
    lines = [
        "## Console: page times with a large runs table",
        "",
        f"Command: `python -m bench.console --runs {runs} --repeat {repeat}`, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load average before / after: "
        f"{loads[0]} / {loads[1]}.",
        "",
        f"{runs:,} runs in the table (2% queued, 500 leased, the rest ended over 7 days, 2% dead "
        "letters). Server time of each page through the ASGI app in process (no network), "
        f"{repeat} requests after one warm-up. Slowest median {worst:.1f} ms "
        f"(target at most 300 ms: {met}).",
        "",
        "| page | median ms | p95 ms | KiB |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, median, p95, kib in measured:
        lines.append(f"| {name} | {median:.1f} | {p95:.1f} | {kib:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    with bench_server() as server:
        url = server.create_database("console")
        from agentruns import migrate

        migrate(url)
        started = time.perf_counter()
        populate(url, args.runs)
        filled = time.perf_counter() - started
        load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
        print(f"{args.runs:,} runs, filled in {filled:.0f}s; load average {load}", flush=True)
        measured = asyncio.run(measure(url, args.repeat))
        after = ", ".join(f"{value:.2f}" for value in os.getloadavg())
        print(f"load average after: {after}")
    if not args.no_write:
        write_section("console", render(measured, args.runs, args.repeat, [load, after]))


if __name__ == "__main__":
    main()
