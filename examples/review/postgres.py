"""The review_job table on PostgreSQL: statements on agentruns' own transaction, so a job and
its run commit together (and the deferred ``review_job_run_agrees`` checks them at commit)."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import RowMapping, text

from agentruns import Transaction, postgres_connection
from examples.review.jobs import ReviewJob, ReviewJobs, ReviewStatus

_COLUMNS = "run_id, workspace, subject, status, attempt"
INSERT = text(
    f"INSERT INTO review_job ({_COLUMNS}) VALUES (:run_id, :workspace, :subject, :status, :attempt)"
)
GET = text(f"SELECT {_COLUMNS} FROM review_job WHERE run_id = :run_id")
LOCK = text(f"SELECT {_COLUMNS} FROM review_job WHERE run_id = :run_id FOR UPDATE")
MOVE = text("UPDATE review_job SET status = :status, attempt = :attempt WHERE run_id = :run_id")


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
        await postgres_connection(tx).execute(
            INSERT,
            {
                "run_id": job.run_id,
                "workspace": job.workspace,
                "subject": job.subject,
                "status": job.status.value,
                "attempt": job.attempt,
            },
        )

    async def get(self, tx: Transaction, run_id: UUID) -> ReviewJob | None:
        row = (await postgres_connection(tx).execute(GET, {"run_id": run_id})).mappings().first()
        return None if row is None else _job(row)

    async def lock(self, tx: Transaction, run_id: UUID) -> ReviewJob | None:
        row = (await postgres_connection(tx).execute(LOCK, {"run_id": run_id})).mappings().first()
        return None if row is None else _job(row)

    async def move(self, tx: Transaction, run_id: UUID, status: ReviewStatus, attempt: int) -> None:
        await postgres_connection(tx).execute(
            MOVE, {"run_id": run_id, "status": status.value, "attempt": attempt}
        )
