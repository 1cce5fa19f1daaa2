"""Review jobs and the handler that keeps each one agreeing with its run.

A review job points to its run and agrees with it: a queued job has a queued run, a running job a
leased run, an ended job an ended run (PostgreSQL refuses a commit where they disagree, with the
deferred constraint trigger ``review_job_run_agrees``). A job's attempt number is its run's epoch
less one while running, and the number its next claim takes while it waits.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from uuid import UUID

import agentruns
from agentruns import AgentRun, AgentRunHandler, AgentRunState, BudgetHold, RunChange, Transaction
from agentruns.testing import MemoryFamily

MIGRATIONS = agentruns.MigrationChain(
    versions=Path(__file__).resolve().parent / "migrations",
    version_table="review_example_version",
)
"""The example's own revisions (the ``review_job`` table and its check)."""


class ReviewStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    ENDED = "ended"


STATUS_OF_RUN_STATE: dict[AgentRunState, ReviewStatus] = {
    AgentRunState.QUEUED: ReviewStatus.QUEUED,
    AgentRunState.LEASED: ReviewStatus.RUNNING,
    AgentRunState.ENDED: ReviewStatus.ENDED,
}


def review_attempt(run: AgentRun) -> int:
    """A review job's attempt number: its run's epoch less one while leased, and the number its
    next claim takes while it waits."""
    return run.epoch - 1 if run.state is AgentRunState.LEASED else run.epoch


@dataclass(frozen=True, slots=True)
class ReviewJob:
    """The review kind's domain row: one per run."""

    run_id: UUID
    workspace: str
    subject: str
    status: ReviewStatus
    attempt: int


class ReviewJobs(Protocol):
    """The review_job table, inside agentruns' transaction."""

    async def insert(self, tx: Transaction, job: ReviewJob) -> None: ...

    async def get(self, tx: Transaction, run_id: UUID) -> ReviewJob | None: ...

    async def lock(self, tx: Transaction, run_id: UUID) -> ReviewJob | None:
        """Read and lock the job until the transaction ends."""
        ...

    async def move(
        self, tx: Transaction, run_id: UUID, status: ReviewStatus, attempt: int
    ) -> None: ...


def review_jobs(family: object) -> ReviewJobs:
    """The review_job table of an adapter family: in memory beside the memory stores, else the
    PostgreSQL table (which needs :data:`MIGRATIONS` applied)."""
    from examples.review.memory import MemoryReviewJobs
    from examples.review.postgres import PostgresReviewJobs

    if isinstance(family, MemoryFamily):
        return MemoryReviewJobs(family.database)
    return PostgresReviewJobs()


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
