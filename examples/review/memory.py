"""The review_job table in memory, in the memory family's transactions (for tests)."""

from __future__ import annotations

from dataclasses import replace
from uuid import UUID

from agentruns import RunNotFound, Transaction
from agentruns.testing import MemoryDatabase, MemoryTable
from examples.review.jobs import ReviewJob, ReviewJobs, ReviewStatus


class MemoryReviewJobs(ReviewJobs):
    def __init__(self, database: MemoryDatabase) -> None:
        self._database = database
        self.rows: MemoryTable[UUID, ReviewJob] = MemoryTable(database)

    async def insert(self, tx: Transaction, job: ReviewJob) -> None:
        self.rows.put(tx, job.run_id, job)

    async def get(self, tx: Transaction, run_id: UUID) -> ReviewJob | None:
        self._database.check(tx)
        return self.rows.get(run_id)

    async def lock(self, tx: Transaction, run_id: UUID) -> ReviewJob | None:
        return await self.get(tx, run_id)

    async def move(self, tx: Transaction, run_id: UUID, status: ReviewStatus, attempt: int) -> None:
        job = self.rows.get(run_id)
        if job is None:
            raise RunNotFound(f"no review job for run {run_id}")
        self.rows.put(tx, run_id, replace(job, status=status, attempt=attempt))
