"""The demo's workers and reapers: real processes on PostgreSQL, or tasks in memory.

A process fleet runs ``agentruns worker`` and ``agentruns reaper`` (two of them: reapers need
no leader) in subprocesses, each writing JSON log lines to its own file, and reads what they did
back from those lines; killing a worker is a SIGKILL. A task fleet (the in-memory demo, where
processes cannot share the store) runs workers and a reaper as asyncio tasks, and killing a
worker drops its runs in flight without settling them, as a crash would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

from agentruns.app.reaper import AgentRunReaper
from agentruns.app.worker import Worker

KINDS_REF = "agentruns.entrypoints.demo.kinds:KINDS"
# What the reaper logs when it takes a lease back or ends an overdue queued run.
LEASE_TAKEN_BACK = "lease taken back"
OVERDUE_ENDED = "queued run past its deadline ended"


class Fleet(Protocol):
    holders: list[str]

    async def start(self) -> None: ...

    async def kill(self, holder: str) -> None:
        """Stop the worker at once: nothing settled, nothing handed back."""
        ...

    async def stop(self, grace: float) -> None:
        """Stop every live worker gracefully (SIGTERM), waiting up to ``grace`` seconds."""
        ...

    def outcomes(self) -> Counter[str]:
        """Run outcomes the workers reported so far, by outcome name."""
        ...

    def crashed(self) -> list[str]:
        """Workers and reapers that stopped on their own (not killed, not stopped)."""
        ...

    def reaped(self) -> Counter[str]:
        """What the reapers did so far: ``taken_back``, ``requeued``, ``overdue_ended``."""
        ...


class ProcessFleet(Fleet):
    def __init__(
        self,
        *,
        workers: int,
        concurrency: int,
        env: Mapping[str, str],
        log_dir: Path,
        reapers: int = 2,
        reap_every: float = 0.25,
    ) -> None:
        self.holders = [f"demo-worker-{number}" for number in range(1, workers + 1)]
        self.reapers = [f"demo-reaper-{number}" for number in range(1, reapers + 1)]
        self._reap_every = reap_every
        self._concurrency = concurrency
        self._env = {**os.environ, **env}
        self._log_dir = log_dir
        self._processes: dict[str, asyncio.subprocess.Process] = {}
        self._killed: set[str] = set()

    def log_path(self, holder: str) -> Path:
        return self._log_dir / f"{holder}.log"

    async def start(self) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        for holder in self.holders:
            await self._spawn(
                holder,
                "worker",
                "--concurrency",
                str(self._concurrency),
                "--holder",
                holder,
            )
        for name in self.reapers:
            await self._spawn(name, "reaper", "--every", str(self._reap_every))

    async def _spawn(self, name: str, command: str, *args: str) -> None:
        with self.log_path(name).open("w") as log:
            self._processes[name] = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agentruns.entrypoints.cli",
                "--log-format",
                "json",
                command,
                "--kinds",
                KINDS_REF,
                *args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self._env,
            )

    def crashed(self) -> list[str]:
        return [
            holder
            for holder, process in self._processes.items()
            if process.returncode is not None and holder not in self._killed
        ]

    async def kill(self, holder: str) -> None:
        self._killed.add(holder)
        process = self._processes[holder]
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        await process.wait()

    async def stop(self, grace: float) -> None:
        live = [p for p in self._processes.values() if p.returncode is None]
        for process in live:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in live:
            try:
                async with asyncio.timeout(grace):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()

    def _records(self, names: list[str]) -> Iterator[dict[str, object]]:
        for name in names:
            path = self.log_path(name)
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict):
                        yield record

    def outcomes(self) -> Counter[str]:
        return Counter(
            str(record["outcome"]) for record in self._records(self.holders) if "outcome" in record
        )

    def reaped(self) -> Counter[str]:
        found: Counter[str] = Counter()
        for record in self._records(self.reapers):
            if record.get("msg") == LEASE_TAKEN_BACK:
                found["taken_back"] += 1
                found["requeued"] += record.get("to") == "queued"
            elif record.get("msg") == OVERDUE_ENDED:
                found["overdue_ended"] += 1
        return found

    def returncodes(self) -> dict[str, int | None]:
        return {holder: process.returncode for holder, process in self._processes.items()}


class TaskFleet(Fleet):
    def __init__(
        self,
        make_worker: Callable[[str], Worker],
        reaper: AgentRunReaper,
        *,
        workers: int,
        reap_every: float = 0.25,
    ) -> None:
        self.holders = [f"demo-worker-{number}" for number in range(1, workers + 1)]
        self._workers = {holder: make_worker(holder) for holder in self.holders}
        self._stops = {holder: asyncio.Event() for holder in [*self.holders, "reaper"]}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._reaper = reaper
        self._reap_every = reap_every
        self._reaped: Counter[str] = Counter()

    async def start(self) -> None:
        for holder, worker in self._workers.items():
            self._tasks[holder] = asyncio.create_task(worker.run(self._stops[holder], grace=10))
        self._tasks["reaper"] = asyncio.create_task(self._reap(self._stops["reaper"]))

    async def _reap(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            report = await self._reaper.tick()
            self._reaped["taken_back"] += report.taken_back
            self._reaped["requeued"] += report.requeued
            self._reaped["overdue_ended"] += report.overdue_ended
            try:
                async with asyncio.timeout(self._reap_every):
                    await stop.wait()
            except TimeoutError:
                pass

    def reaped(self) -> Counter[str]:
        return Counter(self._reaped)

    def crashed(self) -> list[str]:
        return [
            holder
            for holder, task in self._tasks.items()
            if task.done() and not task.cancelled() and task.exception() is not None
        ]

    async def kill(self, holder: str) -> None:
        task = self._tasks[holder]
        task.cancel()
        self._workers[holder].abandon()
        await asyncio.gather(task, return_exceptions=True)

    async def stop(self, grace: float) -> None:
        for stop in self._stops.values():
            stop.set()
        live = [task for task in self._tasks.values() if not task.done()]
        if live:
            await asyncio.wait(live, timeout=grace)

    def outcomes(self) -> Counter[str]:
        found: Counter[str] = Counter()
        for worker in self._workers.values():
            for outcome, count in worker.stats.outcomes.items():
                found[str(outcome)] += count
        return found
