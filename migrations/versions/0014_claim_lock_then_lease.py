"""A claim locks its runs, then leases them by key.

Revision ID: 0014_claim_lock_then_lease
Revises: 0013_event_guard_plan

``agent_claim`` (0005, 0011) took its runs in one statement: a CTE that locks the candidates
(``FOR UPDATE SKIP LOCKED``) joined to the ``UPDATE`` that leases them. Its generic plan cost
about 100 µs of server time per run in a claim of 256 (the worker loop's cohort), against 40 µs
for the same rows locked into an array by one statement and leased by key (``id = ANY``) by the
next. The runs leased are exactly the runs locked: this transaction holds their row locks, and
the lock re-checked that each is still a queued head (ADRs/0019).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

revision = "0014_claim_lock_then_lease"
down_revision = "0013_event_guard_plan"
branch_labels = None
depends_on = None

_LEASE = """        WITH c AS (
            SELECT * FROM unnest(candidates) WITH ORDINALITY AS c (id, eb, load, ord)
        ),
        picked AS (
            SELECT r.id, c.eb, c.load, c.ord
            FROM c CROSS JOIN LATERAL (
                SELECT r.id FROM agent_run r
                WHERE r.id = c.id AND r.state = 'queued' AND r.head AND r.id <> ALL (ids)
                FOR UPDATE SKIP LOCKED) r
            ORDER BY c.ord LIMIT p_limit - cardinality(ids)
        ),
        claimed AS (
            UPDATE agent_run r SET state = 'leased', epoch = r.epoch + 1,
                leased_until = now_ + r.lease, holder = p_holder, claimed_at = now_
            FROM picked WHERE r.id = picked.id AND r.id = ANY (ARRAY(SELECT id FROM picked))
            RETURNING r.id, picked.eb, picked.load, picked.ord
        )
        SELECT COALESCE(array_agg(claimed.id ORDER BY ord), '{}'),
               COALESCE(array_agg(claimed.eb ORDER BY ord), '{}'),
               COALESCE(array_agg(claimed.load ORDER BY ord), '{}')
        INTO more, more_bands, more_loads FROM claimed;
"""

# The candidates this claimer can lock, in claim order; then their leases, by key.
_LOCK_THEN_LEASE = """        SELECT COALESCE(array_agg(p.id ORDER BY p.ord), '{}'),
               COALESCE(array_agg(p.eb ORDER BY p.ord), '{}'),
               COALESCE(array_agg(p.load ORDER BY p.ord), '{}')
        INTO more, more_bands, more_loads
        FROM (
            SELECT r.id, c.eb, c.load, c.ord
            FROM unnest(candidates) WITH ORDINALITY AS c (id, eb, load, ord)
            CROSS JOIN LATERAL (
                SELECT r.id FROM agent_run r
                WHERE r.id = c.id AND r.state = 'queued' AND r.head AND r.id <> ALL (ids)
                FOR UPDATE SKIP LOCKED) r
            ORDER BY c.ord LIMIT p_limit - cardinality(ids)
        ) p;
        UPDATE agent_run r SET state = 'leased', epoch = r.epoch + 1,
            leased_until = now_ + r.lease, holder = p_holder, claimed_at = now_
        WHERE r.id = ANY (more);
"""

_SIGNATURE = "agent_claim(timestamptz, interval, text, integer)"


def _margin() -> str:
    """0011's claim (a pool of ``limit + 8``), as that revision creates it."""
    path = Path(__file__).with_name("0011_claim_margin.py")
    spec = importlib.util.spec_from_file_location("agentruns_migration_0011_claim_margin", path)
    assert spec is not None
    assert spec.loader is not None
    margin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(margin)
    return str(margin._claim("p_limit + 8"))


def claim() -> str:
    function = _margin()
    assert function.count(_LEASE) == 1, "0011's claim changed: split its lease again"
    return function.replace(_LEASE, _LOCK_THEN_LEASE)


def _create(function: str) -> None:
    op.execute(function)
    # CREATE OR REPLACE sets the function's SET list anew: 0011's setting again.
    op.execute(f"ALTER FUNCTION {_SIGNATURE} SET enable_bitmapscan = off")


def upgrade() -> None:
    _create(claim())


def downgrade() -> None:
    _create(_margin())
