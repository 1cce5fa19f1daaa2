"""The review_job table: the review kind's domain row, which must agree with its run at commit
(the deferred constraint trigger ``review_job_run_agrees``)."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy.engine import RowMapping

from agentruns.adapters.postgres import sql
from agentruns.adapters.postgres.database import execute, fetch
from agentruns.app.ports import Transaction
from agentruns.app.reviews import ReviewJob, ReviewJobs, ReviewStatus


def _job(row: RowMapping) -> ReviewJob:
    return ReviewJob(
        run_id=row["run_id"],
        workspace=row["workspace"],
        subject=row["subject"],
        status=ReviewStatus(row["status"]),
        attempt=row["attempt"],
    )


class PostgresReviewJobs(ReviewJobs):
    async def insert(self, tx: Transaction, job: ReviewJob) -> None:
        await execute(
            tx,
            sql.INSERT_REVIEW_JOB,
            {
                "run_id": job.run_id,
                "workspace": job.workspace,
                "subject": job.subject,
                "status": job.status.value,
                "attempt": job.attempt,
            },
        )

    async def get(self, tx: Transaction, run_id: UUID) -> ReviewJob | None:
        rows = await fetch(tx, sql.GET_REVIEW_JOB, {"run_id": run_id})
        return _job(rows[0]) if rows else None

    async def lock(self, tx: Transaction, run_id: UUID) -> ReviewJob | None:
        rows = await fetch(tx, sql.LOCK_REVIEW_JOB, {"run_id": run_id})
        return _job(rows[0]) if rows else None

    async def move(self, tx: Transaction, run_id: UUID, status: ReviewStatus, attempt: int) -> None:
        await execute(
            tx, sql.MOVE_REVIEW_JOB, {"run_id": run_id, "status": status.value, "attempt": attempt}
        )
