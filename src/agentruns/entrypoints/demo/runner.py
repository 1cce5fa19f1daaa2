"""The demo's conductor: enqueue the workload, run the fleet and the reaper, inject the kill,
try the zombie writes, watch the invariants, and report.

It talks to agentruns only through its public use cases and the read model, so the same code
drives the in-memory adapters and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from agentruns.app.ports import BudgetHold, TransactionScope
from agentruns.app.runs import AgentRuns
from agentruns.app.stats import RunStats, RunStatus
from agentruns.domain.claim_order import SubjectKey
from agentruns.domain.errors import AgentRunsError
from agentruns.domain.run import AgentRunFence
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from agentruns.entrypoints.demo.fleet import Fleet
from agentruns.entrypoints.demo.report import DemoReport, Orphan, check_invariants
from agentruns.entrypoints.demo.workload import Workload


class DemoAborted(AgentRunsError):
    """The demo could not go on (a worker process died on its own)."""


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """How big and how long: the defaults are the full demo; tests shrink ``scale``."""

    scale: float = 1.0
    workers: int = 3
    concurrency: int = 8
    seed: int = 7
    timeout: float = 50.0
    kill_at: float = 0.25  # the share of the offered runs ended before one worker is killed
    sample_every: float = 0.2
    reap_every: float = 0.25
    grace: float = 15.0


Progress = Callable[[RunStatus, dict[str, object]], None]


class DemoConductor:
    def __init__(
        self,
        *,
        runs: AgentRuns,
        stats: RunStats,
        scope: TransactionScope,
        fleet: Fleet,
        config: DemoConfig,
        lease: timedelta,
        progress: Progress | None = None,
    ) -> None:
        self._runs = runs
        self._stats = stats
        self._scope = scope
        self._fleet = fleet
        self._config = config
        self._lease = lease
        self._progress = progress or (lambda status, extra: None)
        self._zombie_refused = self._zombie_accepted = 0

    async def run(self, workload: Workload) -> DemoReport:
        await self._enqueue(workload)
        offered = sum(
            1 for run in workload.runs if run.workspace not in (workload.inactive, workload.held)
        )
        started = time.monotonic()
        await self._fleet.start()
        killed: str | None = None
        kill_moment = 0.0
        orphans: list[Orphan] = []
        doubly: set[SubjectKey] = set()
        leased_samples: Counter[str] = Counter()
        contended_samples: Counter[str] = Counter()
        samples = 0
        settled = False
        try:
            while True:
                async with self._scope.transaction() as tx:
                    status = await self._stats.status(tx)
                    doubly.update(await self._stats.doubly_leased_subjects(tx))
                samples += 1
                leased_now = {
                    workspace: status.total(AgentRunState.LEASED, workspace=workspace)
                    for workspace in status.workspaces()
                }
                leased_samples.update(leased_now)
                if _all_backlogged(status):
                    contended_samples.update(leased_now)
                ended = _ended_offered(status)
                if killed is None and ended >= self._config.kill_at * offered:
                    killed, orphans = await self._kill_busiest()
                    kill_moment = time.monotonic()
                await self._watch(orphans, time.monotonic() - kill_moment)
                elapsed = time.monotonic() - started
                self._progress(
                    status,
                    {
                        "elapsed": elapsed,
                        "offered": offered,
                        "killed": killed,
                        "taken_back": self._fleet.reaped()["taken_back"],
                        "zombie_refused": self._zombie_refused,
                        "outcomes": self._fleet.outcomes(),
                    },
                )
                orphans_done = all(orphan.zombie_writes_tried for orphan in orphans)
                if orphans_done and _settled(status):
                    settled = True
                    break
                if elapsed > self._config.timeout:
                    break
                crashed = self._fleet.crashed()
                if crashed:
                    raise DemoAborted(f"worker {', '.join(crashed)} exited on its own: see its log")
                await asyncio.sleep(self._config.sample_every)
        finally:
            await self._fleet.stop(self._config.grace)
        elapsed = time.monotonic() - started
        async with self._scope.transaction() as tx:
            final = await self._stats.status(tx)
            doubly.update(await self._stats.doubly_leased_subjects(tx))
            unsettled = await self._stats.unsettled(tx)
        reaped = self._fleet.reaped()
        report = DemoReport(
            enqueued=len(workload.runs),
            offered=offered,
            final=final,
            outcomes=self._fleet.outcomes(),
            taken_back=reaped["taken_back"],
            taken_back_requeued=reaped["requeued"],
            overdue_ended=reaped["overdue_ended"],
            killed=killed,
            orphans=orphans,
            zombie_refused=self._zombie_refused,
            zombie_accepted=self._zombie_accepted,
            samples=samples,
            doubly_leased=doubly,
            leased_share=_shares(leased_samples),
            contended_share=_shares(contended_samples),
            run_share=_shares(Counter(run.workspace for run in workload.runs)),
            elapsed=elapsed,
            settled=settled,
            lease=self._lease,
            faults=workload.faults(),
        )
        report.checks = check_invariants(report, unsettled)
        return report

    async def _enqueue(self, workload: Workload) -> None:
        async with self._scope.transaction() as tx:
            now = await self._runs.stores.runs.now(tx)
        await self._runs.set_workspace_active(workload.inactive, False)
        await self._runs.hold_budget(
            BudgetHold(workload.held, until=now + timedelta(hours=1), reason="monthly budget spent")
        )
        batch = 200
        for start in range(0, len(workload.runs), batch):
            async with self._runs.transaction() as tx:
                for run in workload.runs[start : start + batch]:
                    deadline = None if run.deadline_after is None else now + run.deadline_after
                    await self._runs.enqueue(
                        run.kind,
                        workspace=run.workspace,
                        subject=run.subject,
                        band=run.band,
                        payload=run.payload,
                        deadline_at=deadline,
                        tx=tx,
                    )

    async def _kill_busiest(self) -> tuple[str | None, list[Orphan]]:
        """SIGKILL the worker holding the most leases; its leased runs become orphans."""
        async with self._scope.transaction() as tx:
            held = {
                holder: len(
                    await self._stats.runs(
                        tx, state=AgentRunState.LEASED, holder=holder, limit=10_000
                    )
                )
                for holder in self._fleet.holders
            }
        busiest = max(held, key=lambda holder: held[holder])
        if held[busiest] == 0:
            return None, []
        await self._fleet.kill(busiest)
        async with self._scope.transaction() as tx:
            left = await self._stats.runs(
                tx, state=AgentRunState.LEASED, holder=busiest, limit=10_000
            )
        return busiest, [Orphan(run.fence, run.kind) for run in left]

    async def _watch(self, orphans: list[Orphan], since_kill: float) -> None:
        """Note when each orphan was taken back and claimed again; once it was taken back,
        write under its dead holder's fence, as a zombie would, and count the refusals."""
        for orphan in orphans:
            if orphan.zombie_writes_tried:
                continue
            run = await self._runs.get(orphan.fence.run_id)
            if run.state is AgentRunState.LEASED and run.epoch == orphan.fence.epoch:
                continue
            if orphan.taken_back_after is None:
                orphan.taken_back_after = since_kill
            if run.epoch > orphan.fence.epoch or run.state is AgentRunState.ENDED:
                orphan.claimed_again_after = since_kill
                await self._zombie_writes(orphan.fence)
                orphan.zombie_writes_tried = True

    async def _zombie_writes(self, fence: AgentRunFence) -> None:
        attempts = (
            lambda: self._runs.renew(fence),
            lambda: self._runs.append_event(fence, "zombie", {"note": "written by a dead holder"}),
            lambda: self._runs.end(fence, TerminationReason.COMPLETED),
        )
        for attempt in attempts:
            try:
                await attempt()
            except AgentRunsError:  # LeaseLost, or a refused transition: nothing written
                self._zombie_refused += 1
            else:
                self._zombie_accepted += 1


def _ended_offered(status: RunStatus) -> int:
    unavailable = status.unavailable
    return sum(
        count.count
        for count in status.counts
        if count.state is AgentRunState.ENDED and count.workspace not in unavailable
    )


def _settled(status: RunStatus) -> bool:
    """Nothing leased, and nothing queued where a worker could claim it."""
    if status.total(AgentRunState.LEASED):
        return False
    unavailable = status.unavailable
    return not any(
        count.count
        for count in status.counts
        if count.state is AgentRunState.QUEUED and count.workspace not in unavailable
    )


def _all_backlogged(status: RunStatus) -> bool:
    """Every offered workspace has runs waiting: the claim order alone decides who leases."""
    unavailable = status.unavailable
    offered = [workspace for workspace in status.workspaces() if workspace not in unavailable]
    return bool(offered) and all(
        status.total(AgentRunState.QUEUED, workspace=workspace) > 0 for workspace in offered
    )


def _shares(counts: Counter[str]) -> dict[str, float]:
    total = sum(counts.values())
    return {key: (value / total if total else 0.0) for key, value in sorted(counts.items())}
