"""The SQL claim takes runs in exactly the domain's claim order, on random populations."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from uuid import UUID

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.postgres.database import PostgresDatabase
from agentruns.adapters.postgres.runs import PostgresRunStore
from agentruns.app.ports import ClaimRequest
from agentruns.domain.bands import Band
from agentruns.domain.claim_order import ClaimContext, next_claims
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from tests.postgres.helpers import RESET, write_runs
from tests.strategies import EPOCH, agings, instants, populations, subjects, workspaces


class Harness:
    """One database for every example: reset, written raw, claimed through the adapter."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.runner = asyncio.Runner()
        self.database = self.runner.run(self._open())
        self.raw = psycopg.connect(url, autocommit=True)

    async def _open(self) -> PostgresDatabase:
        return PostgresDatabase(self.url, pool_size=1)

    def claim(self, now: datetime, request: ClaimRequest) -> list[AgentRun]:
        async def go() -> list[AgentRun]:
            database = PostgresDatabase(self.url, ManualClock(now), engine=self.database.engine)
            async with database.transaction() as tx:
                return await PostgresRunStore(database).claim(tx, request)

        return self.runner.run(go())

    def close(self) -> None:
        self.raw.close()
        self.runner.run(self.database.dispose())
        self.runner.close()


@pytest.fixture
def harness(postgres_url: str) -> Iterator[Harness]:
    harness = Harness(postgres_url)
    try:
        yield harness
    finally:
        harness.close()


@st.composite
def scenes(draw: st.DrawFn) -> tuple[list[AgentRun], ClaimContext, int]:
    population = [
        replace(run, kind=draw(st.sampled_from(["review", "chat"])))
        for run in draw(populations(max_size=40))
    ]
    inactive = draw(st.frozensets(workspaces, max_size=2))
    held = draw(st.frozensets(workspaces, max_size=1))
    context = ClaimContext(
        now=draw(instants) + timedelta(hours=1),
        band_aging=draw(st.one_of(agings, st.just(timedelta(0)))),
        leased_per_workspace=Counter(
            run.workspace for run in population if run.state is AgentRunState.LEASED
        ),
        excluded_workspaces=inactive | held,
        kinds=draw(st.one_of(st.none(), st.just(frozenset({"review"})))),
        subject=draw(st.one_of(st.none(), st.none(), st.tuples(workspaces, subjects))),
    )
    limit = draw(st.integers(min_value=1, max_value=max(len(population), 1)))
    return population, replace(context, excluded_workspaces=frozenset(inactive | held)), limit


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scene=scenes(), split=st.integers(min_value=0, max_value=2))
def test_the_sql_claim_takes_runs_in_the_domain_claim_order(
    harness: Harness, scene: tuple[list[AgentRun], ClaimContext, int], split: int
) -> None:
    population, context, limit = scene
    harness.raw.execute(RESET)
    write_runs(harness.raw, population)
    # Some excluded workspaces are inactive, the others under a hold in force (or expired).
    for index, workspace in enumerate(sorted(context.excluded_workspaces)):
        if (index + split) % 2 == 0:
            harness.raw.execute(
                "INSERT INTO agent_workspace (id, active) VALUES (%s, false) "
                "ON CONFLICT (id) DO UPDATE SET active = false",
                (workspace,),
            )
        else:
            harness.raw.execute(
                "INSERT INTO agent_budget_hold (workspace, until) VALUES (%s, %s)",
                (workspace, context.now + timedelta(seconds=1)),
            )
    harness.raw.execute(
        "INSERT INTO agent_budget_hold (workspace, until) VALUES ('ws-spent', %s)",
        (EPOCH,),
    )
    request = ClaimRequest(
        holder="claimer",
        limit=limit,
        kinds=None if context.kinds is None else sorted(context.kinds),
        subject=context.subject,
        band_aging=context.band_aging,
    )

    claimed = harness.claim(context.now, request)

    expected = next_claims(population, context, limit)
    assert [run.id for run in claimed] == [run.id for run in expected]
    for before, after in zip(expected, claimed, strict=True):
        assert (after.state, after.epoch, after.holder) == (
            AgentRunState.LEASED,
            before.epoch + 1,
            "claimer",
        )
        assert after.leased_until == context.now + before.lease


def test_a_background_run_that_waited_an_aging_period_orders_with_batch_runs(
    harness: Harness,
) -> None:
    now = EPOCH + timedelta(hours=2)
    aging = timedelta(minutes=10)
    waited = AgentRun(
        id=UUID(int=1),
        kind="chat",
        workspace="ws-a",
        subject="s-1",
        band=Band.BACKGROUND,
        payload={},
        state=AgentRunState.QUEUED,
        epoch=0,
        attempt=0,
        seq=1,
        enqueued_at=EPOCH,
        due_at=now - 2 * aging,
    )
    fresh = replace(
        waited,
        id=UUID(int=2),
        workspace="ws-b",
        subject="s-2",
        band=Band.BATCH,
        seq=2,
        due_at=now - timedelta(seconds=1),
    )
    younger = replace(waited, id=UUID(int=3), subject="s-3", seq=3, due_at=now - aging / 2)
    harness.raw.execute(RESET)
    write_runs(harness.raw, [waited, fresh, younger])
    claimed = harness.claim(now, ClaimRequest(holder="w", limit=3, band_aging=aging))
    assert [run.id for run in claimed] == [waited.id, fresh.id, younger.id]
