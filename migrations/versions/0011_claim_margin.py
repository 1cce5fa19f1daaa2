"""A claim ranks a few more heads than it takes.

Revision ID: 0011_claim_margin
Revises: 0010_moved_without_join

``agent_claim`` (0005) ranked exactly ``limit`` candidates first. Concurrent claimers rank the
same first heads, so all but one found their one candidate locked and ranked again with a pool
four times wider: a second pass over the lanes for most single claims. The pool now starts at
``limit + 8`` (ADR 0004's margin): a claimer that finds the first candidates locked takes the
next ones in claim order from the same pass, as every ``SKIP LOCKED`` queue does (ADRs/0017).

The claim also runs without bitmap scans. Its plans are generic, made once per connection from
the statistics of the moment; statistics taken while the lanes were still empty (after a bulk
load, before the first fold) made the lane walk a bitmap scan of every lane and a sort: 5.7 ms
per band at 10,000 workspaces instead of an ordered walk of a few index pages.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

revision = "0011_claim_margin"
down_revision = "0010_moved_without_join"
branch_labels = None
depends_on = None

_FIRST_POOL = "    pool integer := p_limit;"


def _claim(first_pool: str) -> str:
    path = Path(__file__).with_name("0005_claim_lanes.py")
    spec = importlib.util.spec_from_file_location("agentruns_migration_0005_claim_lanes", path)
    assert spec is not None
    assert spec.loader is not None
    lanes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lanes)
    function = lanes.CLAIM[lanes.CLAIM.index("CREATE FUNCTION agent_claim(") :]
    assert function.count(_FIRST_POOL) == 1, "0005's claim changed: set its first pool again"
    function = function.replace(_FIRST_POOL, f"    pool integer := {first_pool};")
    return function.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


_SIGNATURE = "agent_claim(timestamptz, interval, text, integer)"


def upgrade() -> None:
    op.execute(_claim("p_limit + 8"))
    op.execute(f"ALTER FUNCTION {_SIGNATURE} SET enable_bitmapscan = off")


def downgrade() -> None:
    op.execute(_claim("p_limit"))  # its own SET list: sequential scans off, bitmap scans as before
