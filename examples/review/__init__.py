"""The review kind: the worked example of a run kind with a domain row of its own.

A host that wants it opts in: its table comes from its own chain of revisions
(:data:`MIGRATIONS`, applied after agentruns' schema with
``agentruns.migrate(url, chain=MIGRATIONS)``), its handler keeps each review job agreeing with
its run, and PostgreSQL refuses a commit where they disagree (the deferred constraint trigger
``review_job_run_agrees``). ::

    jobs = review_jobs(client.family)          # the memory or the PostgreSQL table
    kinds = agentruns.RunKinds([agentruns.RunKind(policy, steps, ReviewRunKind(jobs))])
"""

from examples.review.jobs import (
    MIGRATIONS,
    STATUS_OF_RUN_STATE,
    ReviewJob,
    ReviewJobs,
    ReviewRunKind,
    ReviewStatus,
    review_attempt,
    review_jobs,
)
from examples.review.memory import MemoryReviewJobs
from examples.review.postgres import PostgresReviewJobs

__all__ = [
    "MIGRATIONS",
    "STATUS_OF_RUN_STATE",
    "MemoryReviewJobs",
    "PostgresReviewJobs",
    "ReviewJob",
    "ReviewJobs",
    "ReviewRunKind",
    "ReviewStatus",
    "review_attempt",
    "review_jobs",
]
