"""On a populated database the claim touches about its limit's worth of pages, whatever the
number of workspaces, and never scans the runs table in full."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from agentruns.adapters.postgres import make_postgres_stores, sql as statements
from agentruns.adapters.postgres.database import PostgresDatabase, PostgresTransaction, bound
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


async def _buffers(url: str, statement: str, params: dict[str, object]) -> int:
    """Shared buffers one run of ``statement`` touches (hit or read), on a connection that ran
    it once before (its plans made: planning reads the catalog), everything rolled back."""
    stores = make_postgres_stores(url)
    database = stores.scope
    assert isinstance(database, PostgresDatabase)
    try:
        async with database.transaction() as tx:
            assert isinstance(tx, PostgresTransaction)
            await tx.connection.execute(text("SAVEPOINT warm"))
            await tx.connection.execute(text(statement), params)
            await tx.connection.execute(text("ROLLBACK TO SAVEPOINT warm"))
            explain = text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement)
            result = await tx.connection.execute(explain, params)
            document = result.scalar_one()
            await tx.connection.rollback()
        plan = (document if isinstance(document, list) else json.loads(document))[0]["Plan"]
        return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])
    finally:
        await database.dispose()


# Buffers a claim may touch on 100,000 queued runs over 1,000 workspaces (10,000 subjects, 500
# leased and 20,000 ended runs): about the lanes and heads of its pool (limit + 8), whatever the
# number of workspaces (measured: 171 for one run and 583 for ten; with a pool of exactly the
# limit, 68 and 472). The claim before the lanes (ADRs/0004) touched 12,377 and 14,279.
BUFFER_BOUND = {1: 300, 10: 800}


@pytest.mark.parametrize("limit", [1, 10])
async def test_a_claim_touches_a_bounded_number_of_buffers_at_a_thousand_workspaces(
    populated: str, limit: int
) -> None:
    params = {"now": None, "holder": "w", "limit": limit, "aging": "10 minutes", "alone": True}
    touched = await _buffers(populated, statements.CLAIM.text, params)
    assert touched <= BUFFER_BOUND[limit], touched


@pytest.mark.parametrize("limit", [1, 10])
async def test_a_claim_of_some_kinds_reads_no_table_of_runs_in_full(
    populated: str, limit: int
) -> None:
    """The kinds-restricted claim probes each open workspace by index, never a full scan."""
    params: dict[str, object] = {
        "now": None,
        "holder": "w",
        "limit": limit,
        "pool": limit * 4 + 8,
        "aging": "10 minutes",
        "kinds": ["review"],
    }
    nodes = await _plan(populated, statements.CLAIM_KINDS.text, params)
    scanned = {node.get("Relation Name") for node in nodes if node["Node Type"] == "Seq Scan"}
    assert "agent_run" not in scanned
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


async def test_taking_back_a_batch_reads_each_run_once_whatever_the_statistics(
    postgres_url: str,
) -> None:
    """The reaper's set-based take-back finds each run by its key. Here the statistics were
    taken before any run was leased, as on a host whose autovacuum has not caught up: a lookup
    that named the state went through the leased index and read every leased run for each run
    it took back (quadratic in the batch)."""
    with psycopg.connect(postgres_url, autocommit=True) as raw:
        populate(raw, queued=5_000, workspaces=50, subjects=5_000)  # and ANALYZE
        leased = raw.execute(
            "SELECT id, epoch FROM agent_claim(NULL, interval '10 minutes', 'w', 1000)"
        ).fetchall()
    assert len(leased) == 1_000
    batch = [[str(run_id), epoch, 10, 1.0, None, None, None, None] for run_id, epoch in leased]
    params: dict[str, object] = {
        "now": "2999-01-01T00:00:00+00:00",  # every lease has run out
        "take_backs": json.dumps(batch),
    }
    touched = await _buffers(postgres_url, statements.TAKE_BACK_MANY.text, params)
    # Measured: 23,544 buffers for the 1,000 (its key, its row, its new version and index
    # entries, the triggers' ledger); the lookup through the leased index read 853,567.
    assert touched <= 60 * len(leased), touched


async def test_a_claim_walks_the_lanes_in_order_whatever_the_statistics(
    postgres_url: str,
) -> None:
    """Statistics taken while the lanes were empty (after a bulk load, before the first fold)
    must not turn the lane walk into a scan of every lane: the claim of one still reads about
    its pool's lanes and heads at 3,000 workspaces."""
    with psycopg.connect(postgres_url, autocommit=True) as raw:
        populate(raw, queued=6_000, workspaces=3_000, subjects=6_000)
        raw.execute(
            "UPDATE agent_workspace SET h0_due = NULL, h0_seq = NULL, h1_due = NULL, "
            "h1_seq = NULL, h2_due = NULL, h2_seq = NULL"
        )
        raw.execute("ANALYZE agent_workspace")
        raw.execute(
            "INSERT INTO agent_workspace_delta (workspace, bands) SELECT id, 7 FROM agent_workspace"
        )
        raw.execute("SELECT agent_lane_fold()")
    params = {"now": None, "holder": "w", "limit": 1, "aging": "10 minutes", "alone": True}
    touched = await _buffers(postgres_url, statements.CLAIM.text, params)
    # Measured: 220 buffers walked in index order; 367 with the lane walk as a bitmap scan of
    # every lane and a sort (and that grows with the lanes: ~300 per band at 10,000).
    assert touched <= BUFFER_BOUND[1], touched


# The sequential scans of the runs' two tables so far in this transaction (ADRs/0035).
_SCANS = (
    "SELECT COALESCE(sum(seq_scan), 0) FROM pg_stat_xact_user_tables "
    "WHERE relname IN ('agent_run', 'agent_run_history')"
)


def _on_its_generic_plan(
    raw: psycopg.Connection[tuple[Any, ...]], statement: Any, params: dict[str, object]
) -> tuple[list[tuple[Any, ...]], int]:
    """The rows ``statement`` answers on its generic plan (as the adapter runs it), and the
    sequential scans of agent_run and agent_run_history it made; everything it wrote rolled
    back."""
    query, values = bound(statement, params)
    scans = _SCANS
    with raw.transaction(force_rollback=True):
        raw.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        before = raw.execute(scans).fetchone()
        rows = raw.execute(query, values).fetchall()
        after = raw.execute(scans).fetchone()
    assert before is not None
    assert after is not None
    return rows, int(after[0]) - int(before[0])


async def test_a_group_of_step_boundaries_looks_each_run_up_by_key(postgres_url: str) -> None:
    """The event guard joins a group's new events to their runs by key, however big the group:
    with groups of a few hundred the planner read every run (a sequential scan and a hash join
    per group: 40 µs of server time per event in the throughput bench, ADRs/0019)."""
    with psycopg.connect(postgres_url, autocommit=True) as raw:
        populate(raw, queued=15_000, workspaces=50, subjects=15_000)  # and ANALYZE
        leased = raw.execute(
            "SELECT id, workspace, epoch FROM agent_claim(NULL, interval '10 minutes', 'w', 300)"
        ).fetchall()
        assert len(leased) == 300
        writes = json.dumps([[str(i), ws, epoch, "step", {}] for i, ws, epoch in leased])
        renewed, scans = _on_its_generic_plan(
            raw, statements.RENEW_AND_APPEND_MANY, {"now": None, "writes": writes}
        )
    assert len(renewed) == 300
    assert scans == 0, scans


def test_a_purge_batch_deletes_its_runs_by_key_on_its_generic_plan(postgres_url: str) -> None:
    """Each batch of a purge finds its ended runs by their end time and deletes them by key. On
    its generic plan the batch's LIMIT is a parameter the planner guesses at a tenth of the runs
    the end time might match: on a table of mostly ended runs, as a host's is, a delete joined
    to that guess read the whole runs table for every batch (about 4 s a batch of 1,000 at
    10,000,000 runs, `bench.purge`)."""
    with psycopg.connect(postgres_url, autocommit=True) as raw:
        populate(raw, queued=1_000, workspaces=50, subjects=1_000, ended=30_000)  # and ANALYZE
        raw.execute("SELECT agent_run_archive(20000)")  # the rest wait in agent_run
        raw.execute("ANALYZE")
        purged, scans = _on_its_generic_plan(
            raw, statements.PURGE, {"ended_before": "2999-01-01T00:00:00+00:00", "limit": 1000}
        )
    assert len(purged) == 1000
    assert scans == 0, scans


def test_a_move_probes_the_history_by_key_however_much_it_grew(postgres_url: str) -> None:
    """The reaper's moves run on one session for hours, so the triggers that check each moved
    run against the other table keep the plans their first move made, when the history was
    empty. As an anti-join that plan read more of the history per run the larger it grew (a
    batch of 500 took 50 ms beside a history of 500 runs, 960 ms beside 9,500: ADRs/0035)."""
    with psycopg.connect(postgres_url, autocommit=True) as raw:
        raw.execute("SET plan_cache_mode = force_generic_plan")
        assert raw.execute("SELECT agent_run_archive(500)").fetchone() == (0,)  # plans cached
        populate(raw, queued=0, workspaces=50, subjects=1_000, ended=6_000)  # and ANALYZE
        moved = 0
        with raw.transaction(force_rollback=True):
            before = raw.execute(_SCANS).fetchone()
            for _ in range(12):
                row = raw.execute("SELECT agent_run_archive(500)").fetchone()
                assert row is not None
                moved += int(row[0])
            after = raw.execute(_SCANS).fetchone()
    assert moved == 6_000
    assert before is not None
    assert after is not None
    assert int(after[0]) - int(before[0]) == 0


def _plan_cost(document: Any) -> tuple[float, bool]:
    plan = (document if isinstance(document, list) else json.loads(document))[0]
    return float(plan["Plan"]["Total Cost"]), "JIT" in plan


async def _cost(url: str, statement: str, params: dict[str, object]) -> tuple[float, bool, float]:
    """The plan's total cost, whether PostgreSQL would JIT-compile it, and jit_above_cost."""
    stores = make_postgres_stores(url)
    database = stores.scope
    assert isinstance(database, PostgresDatabase)
    try:
        async with database.transaction() as tx:
            assert isinstance(tx, PostgresTransaction)
            result = await tx.connection.execute(text("EXPLAIN (FORMAT JSON) " + statement), params)
            cost, jitted = _plan_cost(result.scalar_one())
            above = await tx.connection.execute(text("SELECT current_setting('jit_above_cost')"))
            return cost, jitted, float(above.scalar_one())
    finally:
        await database.dispose()


HOT = {
    "claim": (
        statements.CLAIM,
        {"now": None, "holder": "w", "limit": 64, "aging": "10 minutes", "alone": True},
    ),
    "claim of some kinds": (
        statements.CLAIM_KINDS,
        {
            "now": None,
            "holder": "w",
            "limit": 64,
            "pool": 264,
            "aging": "10 minutes",
            "kinds": ["review", "other"],
        },
    ),
    "claim of the kinds a worker knows": (
        statements.CLAIM_IF_KNOWN,
        {
            "now": None,
            "holder": "w",
            "limit": 64,
            "aging": "10 minutes",
            "kinds": ["review"],
            "alone": True,
        },
    ),
    "expired leases": (statements.EXPIRED, {"now": None, "limit": 500, "kinds": None}),
    "purge": (statements.PURGE, {"ended_before": "2999-01-01T00:00:00+00:00", "limit": 1000}),
}


@pytest.mark.parametrize("name", sorted(HOT))
async def test_no_hot_statement_plans_past_the_jit_threshold(populated: str, name: str) -> None:
    """On a server with JIT on (a packaged PostgreSQL's default), a plan that costs more than
    jit_above_cost is compiled on every execution (about half a second for the claim). The
    statements of the hot path stay below it on a populated database, on every server."""
    statement, params = HOT[name]
    cost, jitted, above = await _cost(populated, statement.text, params)
    assert not jitted
    assert cost < above, (cost, above)


async def test_a_function_that_disables_a_plan_node_turns_jit_off(populated: str) -> None:
    """Before PostgreSQL 18 a disabled node adds 1e10 to its plan's cost, past any
    jit_above_cost: a function that turns a node off must turn JIT off with it (0015)."""
    with psycopg.connect(populated) as connection:
        rows = connection.execute(
            "SELECT p.proname, p.proconfig FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND p.proconfig IS NOT NULL"
        ).fetchall()
    disabling = {
        name: config for name, config in rows if any(s.startswith("enable_") for s in config)
    }
    assert {"agent_claim", "guard_agent_run_event_insert"} <= disabling.keys()
    for name, config in disabling.items():
        assert "jit=off" in config, (name, config)


# Names of promoted heads fetched through an index so far in this transaction (ADRs/0037).
_NAMES_READ = (
    "SELECT COALESCE(sum(idx_tup_fetch), 0) FROM pg_stat_xact_user_tables "
    "WHERE relname = 'agent_subject_head'"
)


def _claim_and_end(raw: psycopg.Connection[tuple[Any, ...]], limit: int) -> int:
    rows = raw.execute(
        "SELECT id FROM agent_claim(NULL, interval '10 minutes', 'w', %s)", (limit,)
    ).fetchall()
    raw.execute(
        "UPDATE agent_run SET state = 'ended', end_reason = 'completed', ended_at = now(), "
        "leased_until = NULL WHERE id = ANY (%s)",
        ([row[0] for row in rows],),
    )
    return len(rows)


def test_promoted_heads_are_read_by_key_on_plans_made_while_none_was_promoted(
    postgres_url: str,
) -> None:
    """A worker's session plans the claim and the runs' triggers once, often while no run is
    promoted (after a vacuum, at the start of a drain), and keeps those plans. Planned for an
    empty agent_subject_head, the claim's re-check of a promoted head hashed the whole table on
    every claim, and a subject's probe read every name of its workspace: a 100,000-run drain read
    37.8 million names, and ran at 0.6x the rate without (ADRs/0037)."""
    with (
        psycopg.connect(postgres_url, autocommit=True) as raw,
        psycopg.connect(postgres_url, autocommit=True) as other,
    ):
        populate(raw, queued=6_000, workspaces=5, subjects=1_000)  # six runs a subject
        raw.execute("SET plan_cache_mode = force_generic_plan")
        assert _claim_and_end(raw, 8) == 8  # its plans made, no run promoted before
        flagged = "SELECT count(*) FROM agent_run WHERE state = 'queued' AND head"
        while raw.execute(flagged).fetchone() != (0,):  # every head left is a promoted one
            _claim_and_end(other, 500)
        named = raw.execute("SELECT count(*) FROM agent_subject_head").fetchone()
        assert named is not None
        assert int(named[0]) >= 400, named
        with raw.transaction(force_rollback=True):
            before = raw.execute(_NAMES_READ).fetchone()
            assert _claim_and_end(raw, 64) == 64  # 64 promoted heads claimed, 64 promoted
            after = raw.execute(_NAMES_READ).fetchone()
    assert before is not None
    assert after is not None
    # Measured, with 500 names: 308 read with the probes by key; 5,824 on revision 0031 (the
    # hash of every name, and the workspace's 100 names per probe), growing with the names.
    assert int(after[0]) - int(before[0]) <= 1_000, int(after[0]) - int(before[0])


def test_a_claim_reads_the_ledger_by_its_key(postgres_url: str) -> None:
    """Every claim folds the lanes' ledger, which takes and loses some 2.5 rows a run and keeps
    the pages it grew to until a vacuum: read by a sequential scan, three times a claim, it
    made a 100,000-run drain's claims twice as slow at its end as at its start (ADRs/0037)."""
    ledger = (
        "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables "
        "WHERE relname = 'agent_workspace_delta'"
    )
    with psycopg.connect(postgres_url, autocommit=True) as raw:
        populate(raw, queued=2_000, workspaces=50, subjects=2_000)
        raw.execute("SET plan_cache_mode = force_generic_plan")
        assert _claim_and_end(raw, 32) == 32  # the ledger holds the leases and the ends
        with raw.transaction(force_rollback=True):
            pending = raw.execute("SELECT count(*) FROM agent_workspace_delta").fetchone()
            before = raw.execute(ledger).fetchone()
            assert _claim_and_end(raw, 32) == 32
            after = raw.execute(ledger).fetchone()
    assert pending is not None
    assert int(pending[0]) > 0
    assert before is not None
    assert after is not None
    assert int(after[0]) - int(before[0]) == 0  # no sequential scan
    assert int(after[1]) - int(before[1]) > 0  # read by its key
