"""A cancel racing a claim of the same review run: whichever side PostgreSQL aborts, the run
ends CANCELLED and its review job agrees."""

from __future__ import annotations

import asyncio
import random

from agentruns.adapters.postgres import (
    close_postgres_stores,
    make_postgres_stores,
)
from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.ports import Transaction
from agentruns.app.runs import AgentRuns
from agentruns.domain.errors import TransactionConflict
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from examples.review import PostgresReviewJobs, ReviewRunKind, ReviewStatus
from tests.contract.kinds import policy, scripted_steps
from tests.postgres.helpers import some_session_waits_on_a_lock


class PausingReviews(ReviewRunKind):
    """Moves the job like the review kind, but a claim first waits until told to go on."""

    def __init__(self, jobs: PostgresReviewJobs) -> None:
        super().__init__(jobs)
        self.claim_holds_run = asyncio.Event()
        self.go_on = asyncio.Event()

    async def on_moved(self, tx: Transaction, run: AgentRun) -> None:
        if run.state is AgentRunState.LEASED and not self.go_on.is_set():
            self.claim_holds_run.set()
            await self.go_on.wait()
        await super().on_moved(tx, run)


async def test_a_cancel_racing_a_claim_of_its_run_still_cancels(postgres_url: str) -> None:
    stores = make_postgres_stores(postgres_url)
    jobs = PostgresReviewJobs()
    handler = PausingReviews(jobs)
    runs = AgentRuns(
        stores, RunKinds([RunKind(policy("review"), scripted_steps, handler)]), random.Random(3)
    )
    try:
        run = await runs.enqueue("review", workspace="acme", subject="review:1")
        claim = asyncio.create_task(runs.claim("worker"))
        await handler.claim_holds_run.wait()  # the claim holds the run, not yet the job
        cancel = asyncio.create_task(runs.cancel(run.id))
        await some_session_waits_on_a_lock(postgres_url)  # the cancel holds the job, waits
        handler.go_on.set()  # the claim now wants the job: a deadlock PostgreSQL breaks
        claimed, cancelled = await asyncio.gather(claim, cancel, return_exceptions=True)
        assert not isinstance(cancelled, BaseException)
        assert cancelled.end_reason is TerminationReason.CANCELLED
        assert isinstance(claimed, (list, TransactionConflict))
        async with stores.scope.transaction() as tx:
            job = await jobs.get(tx, run.id)
        assert job is not None
        assert job.status is ReviewStatus.ENDED
    finally:
        await close_postgres_stores(stores)
