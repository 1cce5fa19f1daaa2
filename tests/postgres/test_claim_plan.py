"""On a populated database the claim never scans the runs table (nor the subjects) in full."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from agentruns.adapters.postgres import make_postgres_stores, sql as statements
from agentruns.adapters.postgres.database import PostgresDatabase, PostgresTransaction
from agentruns.app.ports import ClaimRequest
from agentruns.testing import PostgresTestServer
from bench.population import populate
from tests.postgres_server import CHAINS

QUEUED = 100_000


@pytest.fixture(scope="module")
def populated(agentruns_server: PostgresTestServer) -> Iterator[str]:
    with (
        agentruns_server.database(CHAINS) as url,
        psycopg.connect(url, autocommit=True) as connection,
    ):
        populate(
            connection,
            queued=QUEUED,
            workspaces=1_000,
            subjects=10_000,
            leased=500,
            ended=20_000,
        )
        yield url


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def _plan(url: str, statement: str, params: dict[str, object]) -> list[dict[str, Any]]:
    stores = make_postgres_stores(url)
    database = stores.scope
    assert isinstance(database, PostgresDatabase)
    try:
        async with database.transaction() as tx:
            assert isinstance(tx, PostgresTransaction)
            explain = text("EXPLAIN (FORMAT JSON) " + statement)
            result = await tx.connection.execute(explain, params)
            document = result.scalar_one()
        plan = document if isinstance(document, list) else json.loads(document)
        return list(_nodes(plan[0]["Plan"]))
    finally:
        await database.dispose()


@pytest.mark.parametrize("kinds", [None, ["review"]])
@pytest.mark.parametrize("limit", [1, 10])
async def test_the_claim_plan_reads_no_table_of_runs_or_subjects_in_full(
    populated: str, limit: int, kinds: list[str] | None
) -> None:
    params: dict[str, object] = {
        "now": None,
        "holder": "w",
        "limit": limit,
        "pool": limit + 8,
        "aging": "10 minutes",
        "kinds": kinds,
    }
    nodes = await _plan(populated, statements.CLAIM.text, params)
    scanned = {node.get("Relation Name") for node in nodes if node["Node Type"] == "Seq Scan"}
    assert "agent_run" not in scanned
    assert "agent_subject" not in scanned
    assert not any(
        node["Node Type"] == "Bitmap Heap Scan"
        for node in nodes
        if node.get("Relation Name") == "agent_run"
    )


async def test_a_claim_on_the_populated_database_takes_distinct_subjects(populated: str) -> None:
    stores = make_postgres_stores(populated)
    try:
        async with stores.scope.transaction() as tx:
            claimed = await stores.runs.claim(tx, ClaimRequest(holder="w", limit=10))
    finally:
        database = stores.scope
        assert isinstance(database, PostgresDatabase)
        await database.dispose()
    assert len(claimed) == 10
    assert len({run.subject for run in claimed}) == 10
    assert len({run.workspace for run in claimed}) == 10
