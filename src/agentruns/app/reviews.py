"""The review kind of the seed, shipped as the worked example of a kind with a domain row.

A review job points to its run and agrees with it: a queued job has a queued run, a running job a
leased run, an ended job an ended run (PostgreSQL refuses a commit where they disagree, with the
deferred constraint trigger ``review_job_run_agrees``). A job's attempt number is its run's epoch
less one while running, and the number its next claim takes while it waits.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from agentruns.app.ports import Transaction
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
