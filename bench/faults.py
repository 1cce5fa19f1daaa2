"""``python -m bench.faults`` (``make faults``): lose nothing, double nothing, while things die.

Runs of the ``fault`` kind (see :mod:`bench.fault_worker`) are queued over several workspaces and
subjects; worker processes drive them while the reaper runs on two replicas. Meanwhile a worker
is SIGKILLed every few seconds and a fresh one started, the embedded PostgreSQL is stopped and
started mid-run, and some holders turn zombie (pause past their lease, then write). A sampler
watches the runs table all along. At the end the run prints and checks:

- runs lost: queued runs that are gone, or neither ended nor waiting to be claimed (must be 0);
- runs ended, by reason;
- recorded steps run twice (must be 0): runs of the ``fault-recorded`` kind count each execution
  of a step's function in ``fault_step_execution`` before it returns; a (run, name, occurrence)
  executed under a later epoch than its ``step.recorded`` event (or twice under one epoch) ran
  again although recorded. Executed again after an execution whose record was refused (the
  holder killed or a zombie) is expected, and counted as steps re-run after an unrecorded
  execution; a record without its execution, or twice, is a violation too;
- waits (ADRs/0025): runs of the ``fault-waiting`` kind wait for the signal ``go``, which a
  signaller of this driver delivers all along (through the kills and restarts), a few before the
  run gets to its wait and most after it parked, each delivery repeated as a retried webhook
  would be (one ``signal_id`` per run). Checked: every such run completed; one
  ``agent_run_signal`` row per (run, signal id) and one signal per run; each run's ``wait:go``
  recorded once, naming its own signal; and the wait's answer, written by the recorded step
  ``answer`` to ``fault_wait_answer``, acted on once per record (again only after an execution
  whose record was refused, as above, and counted so);
- stale-epoch writes attempted by zombies, and accepted (must be 0), and zombie events persisted;
- subjects ever seen with two leased runs (must be 0), event epochs going backwards (must be 0);
- runs queued without a due time (must be 0);
- worker processes that died on their own, e.g. on a PostgreSQL restart (must be 0);
- time from a worker's death to each of its runs being leased again.

It exits non-zero on any violation. ``--small`` is the e2e tier's version.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from agentruns import RunAlreadyEnded, RunNotFound, StoreUnavailable
from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.app.kinds import RunKinds
from agentruns.app.runs import AgentRuns
from bench.results import write_section
from bench.server import BenchServer, bench_server

REPO = Path(__file__).resolve().parents[1]

# Deterministic scripts per run number i: most succeed; some fail now and then, some for good.
# Every recorded_every-th run is of the recorded kind, with scripts of its own (number j among
# them): one in four fails after its first call and is retried, a few turn zombie. Every
# waiting_every-th run (offset by one, so never a recorded one) is of the waits kind.
POPULATE = """
INSERT INTO agent_run (id, kind, workspace, subject, band, payload, state, epoch, attempt,
                       enqueued_at, due_at, lease)
SELECT gen_random_uuid(),
       CASE WHEN recorded THEN 'fault-recorded' WHEN waiting THEN 'fault-waiting' ELSE 'fault' END,
       'ws-' || (i %% %(workspaces)s), 'subject-' || (i %% %(subjects)s), (i %% 3)::smallint,
       CASE WHEN recorded THEN jsonb_build_object(
           'steps', 1 + i %% 3,
           'sleep', %(sleep)s * (1 + i %% 4),
           'fail', CASE j %% 8 WHEN 1 THEN '503' WHEN 2 THEN '429' END,
           'fail_until', CASE j %% 8 WHEN 1 THEN 1 WHEN 2 THEN 2 ELSE 99 END,
           'zombie', j %% %(recorded_zombie_every)s = 3)
       WHEN waiting THEN jsonb_build_object('n', i, 'sleep', %(sleep)s * (1 + i %% 4))
       ELSE jsonb_build_object(
           'steps', 1 + i %% 3,
           'sleep', %(sleep)s * (1 + i %% 4),
           'fail', CASE i %% 40 WHEN 1 THEN '503' WHEN 2 THEN '429' WHEN 3 THEN '401'
                                WHEN 4 THEN 'chain-401' WHEN 5 THEN '503'
                                WHEN 6 THEN 'chain-503' END,
           'fail_until', CASE i %% 40 WHEN 1 THEN 1 WHEN 2 THEN 2 WHEN 6 THEN 1 ELSE 99 END,
           'zombie', i %% %(zombie_every)s = 7) END,
       'queued', 0, 0, now(), now(), interval '3 seconds'
FROM (SELECT i, i %% %(recorded_every)s = 0 AS recorded, i / %(recorded_every)s AS j,
             i %% %(waiting_every)s = 1 AND i %% %(recorded_every)s <> 0 AS waiting
      FROM generate_series(1, %(runs)s) AS i) AS numbered
ORDER BY i
"""

# One row per execution of a recorded step's function, written before the function returns.
EXECUTIONS = """
CREATE TABLE fault_step_execution (
    id uuid PRIMARY KEY,
    run_id uuid NOT NULL,
    name text NOT NULL,
    occurrence int NOT NULL,
    epoch bigint NOT NULL,
    holder text NOT NULL,
    executed_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

# One row per answer of a wait acted on: written by the waits kind's step ``answer`` (its id is
# the execution's) before the step's function returns.
ANSWERS = """
CREATE TABLE fault_wait_answer (
    id uuid PRIMARY KEY,
    run_id uuid NOT NULL,
    epoch bigint NOT NULL,
    signal_id text,
    payload jsonb,
    holder text NOT NULL,
    answered_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

# Per recorded step (run, name, occurrence): the epoch of its first record, how many records,
# its executions after that epoch or twice at one epoch (ran again although recorded: a
# violation), its executions before that epoch or with no record (ran again after an execution
# whose record was refused: expected), and whether the record's result names an execution of
# the record's own epoch. A wait's or a sleep's record is no execution of a function: left out.
RECORDED_STEPS = """
WITH rec AS (
    SELECT run_id, data->>'name' AS name, (data->>'occurrence')::int AS occurrence,
           min(epoch) AS epoch, count(*) AS records,
           bool_and(EXISTS (
               SELECT 1 FROM fault_step_execution x
               WHERE x.id = (e.data->'result'->>'execution')::uuid
                 AND x.run_id = e.run_id AND x.epoch = e.epoch)) AS from_own_execution
    FROM agent_run_event e
    WHERE type = 'step.recorded' AND left(data->>'name', 5) <> 'wait:' AND data->>'name' <> 'sleep'
    GROUP BY 1, 2, 3
), ex AS (
    SELECT run_id, name, occurrence, epoch, count(*) AS executions
    FROM fault_step_execution GROUP BY 1, 2, 3, 4
), steps AS (
    SELECT run_id, name, occurrence, rec.epoch AS recorded_at, rec.records,
           rec.from_own_execution,
           coalesce(sum(ex.executions) FILTER (WHERE ex.epoch > rec.epoch), 0) AS after_record,
           coalesce(sum(ex.executions) FILTER (WHERE ex.epoch = rec.epoch), 0) AS at_record,
           coalesce(sum(ex.executions) FILTER (WHERE rec.epoch IS NULL OR ex.epoch < rec.epoch),
                    0) AS before_record,
           count(DISTINCT ex.epoch) AS epochs,
           coalesce(max(ex.executions), 0) AS most_at_one_epoch
    FROM rec FULL JOIN ex USING (run_id, name, occurrence)
    GROUP BY run_id, name, occurrence, rec.epoch, rec.records, rec.from_own_execution
)
SELECT
    count(*) FILTER (WHERE recorded_at IS NOT NULL) AS recorded,
    count(*) FILTER (WHERE after_record > 0 OR most_at_one_epoch > 1) AS ran_twice,
    count(*) FILTER (WHERE before_record > 0 AND epochs > 1 AND after_record = 0
                     AND most_at_one_epoch = 1) AS rerun_unrecorded,
    count(*) FILTER (WHERE records > 1) AS recorded_twice,
    count(*) FILTER (WHERE recorded_at IS NOT NULL AND at_record = 0) AS recorded_unexecuted,
    count(*) FILTER (WHERE NOT from_own_execution) AS foreign_result,
    coalesce(sum(at_record + after_record + before_record), 0) AS executions
FROM steps
"""

# The waits runs: not completed; signals kept more than once per (run, signal id); runs without
# exactly one signal; ``wait:go`` recorded more than once, or naming another signal.
WAITS = """
WITH w AS (
    SELECT id, state = 'ended' AND end_reason = 'completed' AS completed,
           'go-' || id::text AS signal_id
    FROM agent_run_all WHERE kind = 'fault-waiting'
), sig AS (
    SELECT run_id, count(*) AS signals FROM agent_run_signal GROUP BY 1
), rec AS (
    SELECT e.run_id, count(*) AS records,
           bool_and(e.data->'result'->>'signal_id' = w.signal_id
                    AND e.data->'result'->'payload'->>'signal_id' = w.signal_id
                    AND e.data->'result'->'payload'->>'for' = w.id::text) AS named
    FROM agent_run_event e JOIN w ON w.id = e.run_id
    WHERE e.type = 'step.recorded' AND e.data->>'name' = 'wait:go'
    GROUP BY 1
)
SELECT
    count(*) AS runs,
    count(*) FILTER (WHERE NOT completed) AS not_completed,
    (SELECT count(*) FROM (SELECT 1 FROM agent_run_signal GROUP BY run_id, signal_id
                           HAVING count(*) > 1) AS d) AS signal_rows_doubled,
    count(*) FILTER (WHERE coalesce(sig.signals, 0) <> 1) AS not_one_signal,
    count(*) FILTER (WHERE rec.records IS NULL) AS wait_unrecorded,
    count(*) FILTER (WHERE rec.records > 1) AS wait_recorded_twice,
    count(*) FILTER (WHERE NOT rec.named) AS wait_other_signal
FROM w LEFT JOIN sig ON sig.run_id = w.id LEFT JOIN rec ON rec.run_id = w.id
"""

# Per waits run: the answers acted on (rows of ``fault_wait_answer``) against the epoch at which
# its step ``answer`` was recorded: after it, or twice at one epoch, the answer was acted on again
# although recorded (a violation); before it, after an execution whose record was refused
# (a holder killed: expected). An answer naming another run's signal is a violation.
ANSWERS_CHECK = """
WITH rec AS (
    SELECT run_id, min(epoch) AS epoch FROM agent_run_event
    WHERE type = 'step.recorded' AND data->>'name' = 'answer' GROUP BY 1
), ans AS (
    SELECT run_id, epoch, count(*) AS answers,
           bool_and(signal_id IS NOT DISTINCT FROM 'go-' || run_id::text
                    AND payload->>'for' = run_id::text) AS named
    FROM fault_wait_answer GROUP BY 1, 2
), per AS (
    SELECT ans.run_id, rec.epoch AS recorded_at,
           coalesce(sum(answers) FILTER (WHERE ans.epoch > rec.epoch), 0) AS after_record,
           coalesce(sum(answers) FILTER (WHERE rec.epoch IS NULL OR ans.epoch < rec.epoch), 0)
               AS before_record,
           max(answers) AS most_at_one_epoch,
           bool_and(named) AS named,
           sum(answers) AS answers
    FROM ans LEFT JOIN rec USING (run_id)
    GROUP BY ans.run_id, rec.epoch
)
SELECT
    coalesce(sum(answers), 0) AS answers,
    count(*) FILTER (WHERE after_record > 0 OR most_at_one_epoch > 1) AS acted_twice,
    count(*) FILTER (WHERE before_record > 0 AND after_record = 0 AND most_at_one_epoch = 1)
        AS rerun_unrecorded,
    count(*) FILTER (WHERE NOT named) AS other_signal
FROM per
"""


@dataclass
class Config:
    runs: int = 10_000
    workspaces: int = 8
    subjects: int = 2_000
    workers: int = 4
    concurrency: int = 8
    reapers: int = 2
    kill_every: tuple[float, float] = (3.0, 5.0)
    max_kills: int | None = None
    restarts: int = 2
    restart_at: tuple[float, ...] = (0.3, 0.6)
    downtime: float = 2.0
    step_sleep: float = 0.005
    zombie_every: int = 97
    recorded_every: int = 5
    recorded_zombie_every: int = 29
    waiting_every: int = 10
    # One waits run in early_every has its first delivery at the start, before it gets to its
    # wait; the others after they parked, within signal_after seconds.
    early_every: int = 5
    signal_after: tuple[float, float] = (0.0, 0.5)
    # Each delivery is repeated 1 to 3 times, 0.1 to 2 seconds apart.
    repeats: tuple[int, int] = (1, 3)
    timeout: float = 600.0
    seed: int = 7


@dataclass
class Kill:
    holder: str
    at: float
    runs: dict[str, int]  # run id -> epoch it held at the kill
    taken_back: dict[str, float] = field(default_factory=dict)  # run id -> seconds to take-back
    released: dict[str, float] = field(default_factory=dict)  # run id -> seconds to re-lease
    bands: dict[str, int] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)


@dataclass
class Deliveries:
    """What the signaller did."""

    runs: int = 0
    first_before_wait: int = 0  # the run was not parked on ``go`` just before its first delivery
    first_after_park: int = 0
    attempts: int = 0
    kept: int = 0  # answered created
    answered_kept_before: int = 0  # answered not created: the id was delivered before
    cut_off: int = 0  # failed on the store (a restart): the same delivery is tried again
    refused: list[str] = field(default_factory=list)  # ended, unknown: never expected
    other_answer: list[str] = field(default_factory=list)  # answered another signal's id


class Link:
    """One connection (the sampler's, the signaller's), reconnected across PostgreSQL
    restarts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def connect(self) -> psycopg.AsyncConnection[Any]:
        while True:
            try:
                return await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            except psycopg.OperationalError:
                await asyncio.sleep(0.1)

    async def query(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await self.connect()
                cur = await self._conn.execute(sql, params)
                return list(await cur.fetchall())
            except psycopg.OperationalError:
                if self._conn is not None:
                    await self._conn.close()
                self._conn = None
                await asyncio.sleep(0.1)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


class Signaller:
    """Delivers ``go`` to each waits run, ``signal_id=f"go-{run_id}"``, with a payload naming
    it: some at the start (before the run gets to its wait: the signal is kept for it), the rest
    a moment after the run is seen parked on it; then the same delivery again, 1 to 3 times, as
    a retried webhook would. A delivery cut off by a PostgreSQL restart is tried again."""

    def __init__(self, url: str, config: Config, elapsed: Any) -> None:
        self.url = url
        self.config = config
        self.elapsed = elapsed
        self.rng = random.Random(config.seed + 1)
        self.link = Link(url)
        self.stats = Deliveries()
        self._due: list[tuple[float, int, str]] = []  # (at, deliveries left after it, run id)
        self._first_done: set[str] = set()
        self._scheduled: set[str] = set()

    async def run(self) -> None:
        stores = make_postgres_stores(self.url, None, pool_size=2)
        runs = AgentRuns(stores, RunKinds(), random.Random(self.config.seed))
        try:
            rows = await self.link.query(
                "SELECT id::text FROM agent_run_all WHERE kind = 'fault-waiting' "
                "ORDER BY (payload->>'n')::int"
            )
            self.stats.runs = len(rows)
            for number, (run,) in enumerate(rows):
                if number % self.config.early_every == 0:
                    self._schedule(run, self.elapsed() + self.rng.uniform(0.0, 0.5))
            last_look = -1.0
            while True:
                if self.elapsed() - last_look >= 0.2:
                    last_look = self.elapsed()
                    await self._look()
                now = self.elapsed()
                while self._due and self._due[0][0] <= now:
                    _, left, run = heapq.heappop(self._due)
                    await self._deliver(runs, run)
                    if left:
                        again = self.elapsed() + self.rng.uniform(0.1, 2.0)
                        heapq.heappush(self._due, (again, left - 1, run))
                await asyncio.sleep(0.05)
        finally:
            await close_postgres_stores(stores)
            await self.link.close()

    def _schedule(self, run: str, at: float) -> None:
        self._scheduled.add(run)
        heapq.heappush(self._due, (at, self.rng.randint(*self.config.repeats), run))

    async def _look(self) -> None:
        """Schedule the first delivery of each run seen parked on ``go``."""
        for (run,) in await self.link.query(
            "SELECT id::text FROM agent_run_all WHERE kind = 'fault-waiting' AND state = 'queued' "
            "AND waiting_for = 'go'"
        ):
            if run not in self._scheduled:
                after = self.rng.uniform(*self.config.signal_after)
                self._schedule(run, self.elapsed() + after)

    async def _deliver(self, runs: AgentRuns, run: str) -> None:
        stats = self.stats
        if run not in self._first_done:
            self._first_done.add(run)
            ((parked,),) = await self.link.query(
                "SELECT waiting_for IS NOT DISTINCT FROM 'go' FROM agent_run_all WHERE id = %(id)s",
                {"id": run},
            )
            if parked:
                stats.first_after_park += 1
            else:
                stats.first_before_wait += 1
        signal_id = f"go-{run}"
        while True:
            stats.attempts += 1
            try:
                done = await runs.signal(
                    UUID(run), "go", {"for": run, "signal_id": signal_id}, signal_id=signal_id
                )
            except (StoreUnavailable, psycopg.Error, OSError):
                stats.cut_off += 1
                await asyncio.sleep(0.2)
                continue
            except (RunAlreadyEnded, RunNotFound) as error:
                stats.refused.append(f"{run}: {error}")
                return
            if done.created:
                stats.kept += 1
            else:
                stats.answered_kept_before += 1
            if done.signal.signal_id != signal_id:
                stats.other_answer.append(f"{run}: {done.signal.signal_id}")
            return


@dataclass
class Proc:
    role: str
    holder: str
    popen: subprocess.Popen[bytes]
    killed: bool = False


class FaultRun:
    def __init__(self, server: BenchServer, url: str, config: Config, folder: Path) -> None:
        self.server = server
        self.url = url
        self.config = config
        self.folder = folder
        self.rng = random.Random(config.seed)
        self.procs: list[Proc] = []
        self.generation = 0
        self.kills: list[Kill] = []
        self.doubles: set[str] = set()
        self.undue: set[str] = set()  # runs ever seen queued without a due time
        self.samples = 0
        self.crashes: list[str] = []
        self.restarts_done: list[float] = []
        self.started = time.monotonic()
        self.link = Link(url)
        self.signaller = Signaller(url, config, self.elapsed)
        self.log = open(folder / "processes.log", "ab")  # noqa: SIM115 - the run's lifetime

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def spawn(self, role: str) -> Proc:
        self.generation += 1
        holder = f"{role}-{self.generation}"
        command = [
            sys.executable, "-m", "bench.fault_worker", "--url", self.url, "--role", role,
            "--holder", holder, "--journal", str(self.folder / "journal.jsonl"),
            "--concurrency", str(self.config.concurrency), "--seed", str(self.generation),
        ]  # fmt: skip
        popen = subprocess.Popen(command, cwd=REPO, stdout=self.log, stderr=self.log)
        proc = Proc(role, holder, popen)
        self.procs.append(proc)
        return proc

    async def query(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """A query on the sampler's connection, reconnecting across PostgreSQL restarts."""
        return await self.link.query(sql, params)

    async def sample(self) -> int:
        """One look at the table: doubly leased subjects, re-leases of killed workers' runs;
        returns how many runs have ended."""
        self.samples += 1
        for (subject,) in await self.query(
            "SELECT subject FROM agent_run_all WHERE state = 'leased' "
            "GROUP BY subject HAVING count(*) > 1"
        ):
            self.doubles.add(subject)
        for (run,) in await self.query(
            "SELECT id::text FROM agent_run_all WHERE state = 'queued' AND due_at IS NULL"
        ):
            self.undue.add(run)
        # Counted before the killed runs are looked at: once every run has ended, the look
        # below sees each killed run's last state (a take-back, a re-lease and an end between
        # the look and a later count would otherwise go unrecorded in the run's last sample).
        ((ended,),) = await self.query("SELECT count(*) FROM agent_run_all WHERE state = 'ended'")
        waiting = {
            run: kill
            for kill in self.kills
            for run in kill.runs
            if run not in kill.released and run not in kill.ended
        }
        if waiting:
            rows = await self.query(
                "SELECT id::text, epoch, state, band FROM agent_run_all "
                "WHERE id = ANY(%(ids)s::uuid[])",
                {"ids": list(waiting)},
            )
            for run, epoch, state, band in rows:
                kill = waiting[run]
                kill.bands[run] = band
                since = self.elapsed() - kill.at
                if run not in kill.taken_back and (epoch > kill.runs[run] or state != "leased"):
                    kill.taken_back[run] = since
                if epoch > kill.runs[run] and state != "queued":
                    kill.released[run] = since
                elif state == "ended":
                    kill.ended.add(run)
        return int(ended)

    async def kill_one(self) -> bool:
        """SIGKILL a worker that holds leases (none yet: try again soon) and start another."""
        workers = [p for p in self.procs if p.role == "worker" and not p.killed]
        holding = {
            holder
            for (holder,) in await self.query(
                "SELECT DISTINCT holder FROM agent_run_all WHERE state = 'leased'"
            )
        }
        # A worker that holds leases, so the kill tests their take-back.
        candidates = [p for p in workers if p.holder in holding]
        if not candidates:
            return False
        victim = self.rng.choice(candidates)
        victim.popen.send_signal(signal.SIGKILL)
        victim.popen.wait()
        victim.killed = True
        at = self.elapsed()
        rows = await self.query(
            "SELECT id::text, epoch FROM agent_run_all WHERE holder = %(h)s AND state = 'leased'",
            {"h": victim.holder},
        )
        self.kills.append(Kill(victim.holder, at, {run: epoch for run, epoch in rows}))
        self.spawn("worker")
        print(f"  {at:6.1f}s SIGKILL {victim.holder} holding {len(rows)} runs", flush=True)
        return True

    async def restart_server(self) -> None:
        at = self.elapsed()
        print(f"  {at:6.1f}s PostgreSQL stop", flush=True)
        await asyncio.to_thread(self.server.stop)
        await asyncio.sleep(self.config.downtime)
        await asyncio.to_thread(self.server.start)
        self.restarts_done.append(at)
        print(f"  {self.elapsed():6.1f}s PostgreSQL started again", flush=True)

    def reap_children(self) -> None:
        """A process that exited without our SIGKILL crashed: count it and replace it."""
        for proc in list(self.procs):
            code = proc.popen.poll()
            if code is not None and not proc.killed:
                proc.killed = True
                self.crashes.append(f"{proc.holder} exited {code} at {self.elapsed():.1f}s")
                print(f"  {self.elapsed():6.1f}s {proc.holder} DIED (exit {code})", flush=True)
                self.spawn(proc.role)

    async def drive(self) -> bool:
        """Run until every run has ended or the timeout; True if all ended. The signaller
        delivers all along."""
        signalling = asyncio.create_task(self.signaller.run())
        try:
            return await self._drive(signalling)
        finally:
            signalling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await signalling

    async def _drive(self, signalling: asyncio.Task[None]) -> bool:
        config = self.config
        for _ in range(config.workers):
            self.spawn("worker")
        for _ in range(config.reapers):
            self.spawn("reaper")
        next_kill = self.elapsed() + self.rng.uniform(*config.kill_every)
        restarts = list(config.restart_at[: config.restarts]) if self.server.is_embedded else []
        last_report = 0.0
        while self.elapsed() < config.timeout:
            if signalling.done():
                signalling.result()  # the signaller failed: the run cannot go on
            ended = await self.sample()
            if ended >= config.runs:
                return True
            progress = ended / config.runs
            if restarts and progress >= restarts[0]:
                restarts.pop(0)
                await self.restart_server()
            elif (
                self.elapsed() >= next_kill
                and (config.max_kills is None or len(self.kills) < config.max_kills)
                and await self.kill_one()
            ):
                next_kill = self.elapsed() + self.rng.uniform(*config.kill_every)
            self.reap_children()
            if self.elapsed() - last_report >= 5:
                last_report = self.elapsed()
                print(f"  {last_report:6.1f}s {ended:,} of {config.runs:,} runs ended", flush=True)
            await asyncio.sleep(0.1)
        return False

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                await asyncio.to_thread(proc.popen.wait, remaining)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
        await self.link.close()
        self.log.close()


async def populate(url: str, config: Config) -> None:
    from agentruns.adapters.postgres import migrate

    await asyncio.to_thread(migrate, url)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            POPULATE,
            {
                "runs": config.runs,
                "workspaces": config.workspaces,
                "subjects": config.subjects,
                "sleep": config.step_sleep,
                "zombie_every": config.zombie_every,
                "recorded_every": config.recorded_every,
                "recorded_zombie_every": config.recorded_zombie_every,
                "waiting_every": config.waiting_every,
            },
        )
        await conn.execute(EXECUTIONS)
        await conn.execute(ANSWERS)
        await conn.execute("VACUUM ANALYZE agent_run")


async def verdict(run: FaultRun, finished: bool) -> tuple[dict[str, Any], list[str]]:
    """The checks over the database and the journals: (figures, violations)."""
    q = run.query
    ((present,),) = await q("SELECT count(*) FROM agent_run_all")
    ((stuck,),) = await q(
        "SELECT count(*) FROM agent_run_all WHERE state <> 'ended' "
        "AND NOT (state = 'queued' AND due_at IS NOT NULL) AND NOT state = 'leased'"
    )
    ((unended,),) = await q("SELECT count(*) FROM agent_run_all WHERE state <> 'ended'")
    reasons = dict(
        await q("SELECT end_reason, count(*) FROM agent_run_all GROUP BY 1 ORDER BY 2 DESC")
    )
    ((no_due,),) = await q(
        "SELECT count(*) FROM agent_run_all WHERE state = 'queued' AND due_at IS NULL"
    )
    ((backwards,),) = await q(
        "SELECT count(*) FROM (SELECT epoch < lag(epoch) OVER (PARTITION BY run_id ORDER BY seq)"
        " AS back FROM agent_run_event) e WHERE back"
    )
    ((zombie_events,),) = await q("SELECT count(*) FROM agent_run_event WHERE type = 'zombie'")
    ((events,),) = await q("SELECT count(*) FROM agent_run_event")
    ((recorded_runs,),) = await q(
        "SELECT count(*) FROM agent_run_all WHERE kind = 'fault-recorded'"
    )
    ((recorded, ran_twice, rerun, recorded_twice, unexecuted, foreign, executions),) = await q(
        RECORDED_STEPS
    )
    ((waits, not_completed, signal_doubled, not_one_signal, wait_unrecorded, wait_twice,
      wait_other),) = await q(WAITS)  # fmt: skip
    ((answers, answered_twice, answer_rerun, answer_other),) = await q(ANSWERS_CHECK)
    sent = run.signaller.stats
    replayed = 0
    attempted: dict[str, int] = {}
    accepted: dict[str, int] = {}
    stats: list[dict[str, Any]] = []
    journal = run.folder / "journal.jsonl"
    for line in journal.read_text().splitlines() if journal.exists() else []:
        record = json.loads(line)
        if record["event"] == "stale-attempt":
            attempted[record["what"]] = attempted.get(record["what"], 0) + 1
        elif record["event"] == "stale-accepted":
            accepted[record["what"]] = accepted.get(record["what"], 0) + 1
        elif record["event"] == "replayed":
            replayed += 1
        elif record["event"] == "stats":
            stats.append(record)
    relets = sorted(t for kill in run.kills for t in kill.released.values())
    taken = sorted(t for kill in run.kills for t in kill.taken_back.values())
    by_band = {
        band: _spread(
            sorted(t for kill in run.kills for r, t in kill.released.items() if kill.bands[r] == b)
        )
        for b, band in enumerate(("interactive", "batch", "background"))
    }
    killed_runs = sum(len(kill.runs) for kill in run.kills)
    figures: dict[str, Any] = {
        "runs queued": run.config.runs,
        "runs lost": (run.config.runs - present) + stuck,
        "runs not ended at the end": unended,
        "runs ended by reason": {str(k): v for k, v in reasons.items() if k is not None},
        "stale-epoch writes attempted": attempted,
        "stale-epoch writes accepted": accepted,
        "zombie events persisted": zombie_events,
        "events persisted": events,
        "recorded-steps runs": recorded_runs,
        "recorded steps (persisted / executions counted)": f"{recorded} / {executions}",
        "recorded steps replayed without running": replayed,
        "recorded steps run twice": ran_twice,
        "steps re-run after an unrecorded execution": rerun,
        "recorded steps recorded twice / with no execution / with another's result": (
            f"{recorded_twice} / {unexecuted} / {foreign}"
        ),
        "waits runs": waits,
        "first signals before the wait / after a park": (
            f"{sent.first_before_wait} / {sent.first_after_park}"
        ),
        "waits runs not completed": not_completed,
        "signal deliveries tried": sent.attempts,
        "  kept / answered as kept before / cut off, retried": (
            f"{sent.kept} / {sent.answered_kept_before} / {sent.cut_off}"
        ),
        "deliveries refused / answered with another signal": (
            f"{len(sent.refused)} / {len(sent.other_answer)}"
        ),
        "signals doubled per id / runs without one signal": f"{signal_doubled} / {not_one_signal}",
        "wait:go recorded twice / another's / unrecorded": (
            f"{wait_twice} / {wait_other} / {wait_unrecorded}"
        ),
        "wait answers acted on": answers,
        "wait answers acted on twice": answered_twice,
        "wait answers after an unrecorded execution": answer_rerun,
        "wait answers naming another signal": answer_other,
        "event epochs going backwards": backwards,
        "subjects seen with two leased runs": sorted(run.doubles),
        "table samples taken": run.samples,
        "runs queued without due time (at the end / ever sampled)": f"{no_due} / {len(run.undue)}",
        "workers SIGKILLed": len(run.kills),
        "their leased runs": killed_runs,
        "of those leased again": len(relets),
        "of those ended before re-lease": sum(len(kill.ended) for kill in run.kills),
        "death to take-back, seconds (p50 / p95 / max)": _spread(taken),
        "death to re-lease, seconds (p50 / p95 / max)": _spread(relets),
        "  by band (lower bands wait for higher ones)": by_band,
        "PostgreSQL restarts (at seconds)": [round(t, 1) for t in run.restarts_done],
        "worker or reaper processes that died on their own": run.crashes,
        "seconds": round(run.elapsed(), 1),
    }
    violations = []
    if figures["runs lost"]:
        violations.append(f"{figures['runs lost']} runs lost")
    if not finished:
        violations.append(f"{unended} runs not ended within {run.config.timeout:.0f}s")
    if sum(accepted.values()) or zombie_events:
        violations.append(f"stale writes accepted: {accepted}, zombie events {zombie_events}")
    if ran_twice:
        violations.append(f"{ran_twice} recorded steps ran again after their record")
    if recorded_twice or unexecuted or foreign:
        violations.append(
            f"recorded steps recorded twice: {recorded_twice}, recorded with no execution: "
            f"{unexecuted}, recorded with a result of another execution: {foreign}"
        )
    if recorded_runs and not recorded:
        violations.append("no recorded step was persisted: the run did not test recorded steps")
    if recorded_runs >= run.config.recorded_zombie_every and not rerun:
        violations.append(
            "no step ran again after an unrecorded execution: the run did not test a refused record"
        )
    if recorded_runs >= 8 * run.config.recorded_every and not replayed:
        violations.append("no recorded step was replayed: the run did not test replay")
    if not_completed:
        violations.append(f"{not_completed} waits runs did not complete")
    if sent.refused or sent.other_answer:
        violations.append(
            f"deliveries refused: {sent.refused[:3]}, answered with another signal: "
            f"{sent.other_answer[:3]}"
        )
    if signal_doubled or not_one_signal:
        violations.append(
            f"signals kept twice for one id: {signal_doubled}, waits runs without exactly one "
            f"signal: {not_one_signal}"
        )
    if wait_twice or wait_other or wait_unrecorded:
        violations.append(
            f"waits recorded twice: {wait_twice}, naming another signal: {wait_other}, "
            f"unrecorded: {wait_unrecorded}"
        )
    if answered_twice or answer_other:
        violations.append(
            f"wait answers acted on twice: {answered_twice}, naming another signal: {answer_other}"
        )
    if waits and answers < waits:
        violations.append(f"only {answers} wait answers acted on for {waits} waits runs")
    if waits >= 2 * run.config.early_every and not (
        sent.first_before_wait and sent.first_after_park
    ):
        violations.append(
            "no signal came before its wait, or none after a park: the run did not test both"
        )
    if waits and not sent.answered_kept_before:
        violations.append("no delivery was repeated: the run did not test once per signal id")
    if run.doubles:
        violations.append(f"{len(run.doubles)} subjects seen with two leased runs")
    if backwards:
        violations.append(f"{backwards} events written under an older epoch than an earlier one")
    if no_due or run.undue:
        violations.append(f"{max(no_due, len(run.undue))} runs queued without a due time")
    if run.crashes:
        violations.append(f"{len(run.crashes)} processes died on their own: {run.crashes}")
    if sum(attempted.values()) == 0 and run.config.runs >= 10 * run.config.zombie_every:
        violations.append("no zombie attempted a write: the run did not test fencing")
    if not killed_runs:
        violations.append("no worker was killed holding runs: the run did not test take-backs")
    unrecovered = killed_runs - len(relets) - figures["of those ended before re-lease"]
    if unrecovered:
        violations.append(f"{unrecovered} runs of killed workers were never leased again")
    if run.server.is_embedded and len(run.restarts_done) < run.config.restarts:
        violations.append(f"only {len(run.restarts_done)} PostgreSQL restarts happened")
    return figures, violations


def _spread(values: list[float]) -> str:
    if not values:
        return "none"
    p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
    return f"{statistics.median(values):.2f} / {p95:.2f} / {values[-1]:.2f}"


def render(figures: dict[str, Any], violations: list[str], command: str, pg: str) -> str:
    verdict_line = (
        "**passed**: 0 lost, 0 stale writes accepted, 0 double leases, 0 recorded steps run twice,"
        " 0 signals delivered twice"
        if not violations
        else "**FAILED**: " + "; ".join(violations)
    )
    lines = [
        "## Faults: kills, PostgreSQL restarts and zombies",
        "",
        f"Command: `{command}` (via `make faults`), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{pg}. Verdict: {verdict_line}.",
        "",
        "| check | result |",
        "| --- | --- |",
    ]
    lines += [f"| {name.strip()} | {value} |" for name, value in figures.items()]
    return "\n".join(lines) + "\n"


async def main_async(config: Config, keep: bool, write: bool, command: str) -> int:
    folder = Path(tempfile.mkdtemp(prefix="agentruns-faults-"))
    with bench_server() as server:
        url = server.create_database("faults")
        await populate(url, config)
        print(
            f"fault run: {config.runs:,} runs, {config.workers} workers x {config.concurrency}, "
            f"{config.reapers} reapers, PostgreSQL "
            f"{'embedded (restartable)' if server.is_embedded else 'external (no restarts)'}; "
            f"logs in {folder}",
            flush=True,
        )
        run = FaultRun(server, url, config, folder)
        try:
            finished = await run.drive()
        finally:
            await run.stop()
        figures, violations = await verdict(run, finished)
        pg = f"PostgreSQL {server.settings()['server_version']}"
    if write:
        write_section("faults", render(figures, violations, command, pg))
    print()
    for name, value in figures.items():
        print(f"{name:52} {value}")
    print()
    if violations:
        for violation in violations:
            print(f"VIOLATION: {violation}")
        print(f"fault run FAILED ({len(violations)} violations); logs in {folder}")
        return 1
    print(
        "fault run passed: 0 lost, 0 stale writes accepted, 0 double leases, "
        "0 recorded steps run twice, 0 signals delivered twice"
    )
    if not keep:
        await asyncio.to_thread(shutil.rmtree, folder, True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__)
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--restarts", type=int, default=None)
    parser.add_argument("--kills", type=int, default=None, help="most workers to kill")
    parser.add_argument("--timeout", type=float, default=None, help="seconds")
    parser.add_argument("--small", action="store_true", help="the e2e tier's short version")
    parser.add_argument("--keep", action="store_true", help="keep the logs of a passing run")
    parser.add_argument("--no-write", action="store_true", help="do not write RESULTS.md")
    args = parser.parse_args(argv)
    config = Config()
    if args.small:
        config = Config(
            runs=300, subjects=100, workspaces=4, max_kills=1, restarts=1, restart_at=(0.4,),
            kill_every=(1.0, 1.5), step_sleep=0.02, zombie_every=97, waiting_every=15,
            timeout=90.0,
        )  # fmt: skip
    config.workers = args.workers
    if args.runs is not None:
        config.runs = args.runs
    if args.restarts is not None:
        config.restarts = args.restarts
    if args.kills is not None:
        config.max_kills = args.kills
    if args.timeout is not None:
        config.timeout = args.timeout
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    command = shlex.join(["python", "-m", "bench.faults", *(argv or sys.argv[1:])])
    write = not args.small and not args.no_write
    return asyncio.run(main_async(config, args.keep, write, command.strip()))


if __name__ == "__main__":
    raise SystemExit(main())
