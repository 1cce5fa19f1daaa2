"""The review kind of the seed, shipped as the worked example of a kind with a domain row.

A review job points to its run and agrees with it: a queued job has a queued run, a running job a
leased run, an ended job an ended run (PostgreSQL refuses a commit where they disagree, with the
deferred constraint trigger ``review_job_run_agrees``). A job's attempt number is its run's epoch
less one while running, and the number its next claim takes while it waits.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from agentruns.app.kinds import AgentRunHandler
from agentruns.app.ports import BudgetHold, Transaction
from agentruns.domain.run import AgentRun, RunChange, review_attempt
from agentruns.domain.states import AgentRunState


class ReviewStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    ENDED = "ended"


STATUS_OF_RUN_STATE: dict[AgentRunState, ReviewStatus] = {
    AgentRunState.QUEUED: ReviewStatus.QUEUED,
    AgentRunState.LEASED: ReviewStatus.RUNNING,
    AgentRunState.ENDED: ReviewStatus.ENDED,
}


@dataclass(frozen=True, slots=True)
class ReviewJob:
    """The review kind's domain row: one per run."""

    run_id: UUID
    workspace: str
    subject: str
    status: ReviewStatus
    attempt: int


class ReviewJobs(Protocol):
    """The review_job table."""

    async def insert(self, tx: Transaction, job: ReviewJob) -> None: ...

    async def get(self, tx: Transaction, run_id: UUID) -> ReviewJob | None: ...

    async def lock(self, tx: Transaction, run_id: UUID) -> ReviewJob | None:
        """Read and lock the job until the transaction ends."""
        ...

    async def move(
        self, tx: Transaction, run_id: UUID, status: ReviewStatus, attempt: int
    ) -> None: ...


BudgetCheck = Callable[[Transaction, AgentRun], Awaitable[BudgetHold | None]]


class ReviewRunKind(AgentRunHandler):
    """The handler of review jobs: keeps each job agreeing with its run.

    A job is created with its run (``on_moved`` of a QUEUED run without a job) and moved with
    every transition; the reaper moves it before it takes the run back. ``budget``, if given,
    is asked at claim time.
    """

    def __init__(self, jobs: ReviewJobs, budget: BudgetCheck | None = None) -> None:
        self._jobs = jobs
        self._budget = budget

    @staticmethod
    def attempt(run: AgentRun) -> int:
        return review_attempt(run)

    async def lock_domain_row(self, tx: Transaction, run: AgentRun) -> None:
        await self._jobs.lock(tx, run.id)

    async def on_take_back(self, tx: Transaction, run: AgentRun, change: RunChange) -> None:
        await self.on_moved(tx, run.apply(change))

    async def on_moved(self, tx: Transaction, run: AgentRun) -> None:
        status = STATUS_OF_RUN_STATE[run.state]
        if await self._jobs.get(tx, run.id) is None:
            await self._jobs.insert(
                tx,
                ReviewJob(run.id, run.workspace, run.subject, status, self.attempt(run)),
            )
        else:
            await self._jobs.move(tx, run.id, status, self.attempt(run))

    async def check_budget(self, tx: Transaction, run: AgentRun) -> BudgetHold | None:
        return None if self._budget is None else await self._budget(tx, run)
