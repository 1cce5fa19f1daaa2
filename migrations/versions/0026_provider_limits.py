"""Provider limits: one token-bucket row per named limit (issue 26, part 3; ADRs/0032).

Revision ID: 0026_provider_limits
Revises: 0025_merge

- ``agent_limit``: a limit's definition (requests and tokens per ``per_seconds``), the bursts
  and rates the domain derives from it, its two buckets as of ``level_at``, and
  ``paused_until``, the end of a provider's Retry-After. Every take is one UPDATE of its row.
- ``agent_run_failure.retry_after``: the seconds the provider asked to wait (a Retry-After in
  seconds or as an HTTP date), kept on the failure record; NULL when it said nothing.
"""

from __future__ import annotations

from alembic import op

revision = "0026_provider_limits"
down_revision = "0025_merge"
branch_labels = None
depends_on = None

LIMITS = """
CREATE TABLE agent_limit (
    name text NOT NULL PRIMARY KEY,
    requests bigint,
    tokens bigint,
    per_seconds double precision NOT NULL,
    requests_burst double precision NOT NULL,
    requests_rate double precision NOT NULL,
    tokens_burst double precision NOT NULL,
    tokens_rate double precision NOT NULL,
    requests_level double precision NOT NULL,
    tokens_level double precision NOT NULL,
    level_at timestamp with time zone NOT NULL,
    paused_until timestamp with time zone,
    CONSTRAINT ck_agent_limit_some CHECK (requests IS NOT NULL OR tokens IS NOT NULL),
    CONSTRAINT ck_agent_limit_per CHECK (per_seconds > 0)
);
"""


RETRY_AFTER = "ALTER TABLE agent_run_failure ADD COLUMN retry_after double precision"


def upgrade() -> None:
    op.execute(LIMITS)
    op.execute(RETRY_AFTER)


def downgrade() -> None:
    op.execute("ALTER TABLE agent_run_failure DROP COLUMN retry_after")
    op.execute("DROP TABLE agent_limit")
