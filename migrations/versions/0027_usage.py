"""What steps spent: the run's usage totals and the usage ledger (ADRs/0033).

Revision ID: 0027_usage
Revises: 0026_provider_limits

``agent_run`` gains its totals (``input_tokens``, ``output_tokens``, ``cost``), not indexed, so
the step boundary that adds to them stays a HOT update; ``agent_usage`` keeps one row per step
that reported usage, with no foreign key to the run (it outlives the run's purge), indexed by
(workspace, at) for a workspace's spend per period and by (at) for every workspace's spend in a
window (the console). ``agent_budget`` keeps each workspace's budget and its period's spend, and
``agent_budget_hold.by_budget`` marks the holds a budget wrote. Adding columns with constant defaults
rewrites no row.
"""

from __future__ import annotations

from alembic import op

revision = "0027_usage"
down_revision = "0026_provider_limits"
branch_labels = None
depends_on = None

TOTALS = """
ALTER TABLE agent_run
    ADD COLUMN input_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN output_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN cost numeric NOT NULL DEFAULT 0
"""

LEDGER = """
CREATE TABLE agent_usage (
    run_id uuid NOT NULL,
    seq integer NOT NULL,
    workspace text NOT NULL,
    kind text NOT NULL,
    provider text,
    model text,
    at timestamp with time zone NOT NULL,
    input_tokens bigint,
    output_tokens bigint,
    cost numeric,
    PRIMARY KEY (run_id, seq)
)
"""

LEDGER_INDEX = "CREATE INDEX ix_agent_usage_workspace_at ON agent_usage (workspace, at)"

LEDGER_TIME_INDEX = "CREATE INDEX ix_agent_usage_at ON agent_usage (at)"

BUDGET_HOLD_MARK = (
    "ALTER TABLE agent_budget_hold ADD COLUMN by_budget boolean NOT NULL DEFAULT false"
)

BUDGETS = """
CREATE TABLE agent_budget (
    workspace text NOT NULL,
    tokens bigint,
    cost numeric,
    period text NOT NULL,
    period_start timestamp with time zone NOT NULL,
    spent_tokens bigint NOT NULL DEFAULT 0,
    spent_cost numeric NOT NULL DEFAULT 0,
    hold_reason text NOT NULL,
    PRIMARY KEY (workspace),
    CONSTRAINT ck_agent_budget_period CHECK (period IN ('day', 'month')),
    CONSTRAINT ck_agent_budget_limit CHECK (tokens IS NOT NULL OR cost IS NOT NULL)
)
"""


def upgrade() -> None:
    op.execute(TOTALS)
    op.execute(LEDGER)
    op.execute(LEDGER_INDEX)
    op.execute(LEDGER_TIME_INDEX)
    op.execute(BUDGET_HOLD_MARK)
    op.execute(BUDGETS)


def downgrade() -> None:
    op.execute("DROP TABLE agent_budget")
    op.execute("ALTER TABLE agent_budget_hold DROP COLUMN by_budget")
    op.execute("DROP TABLE agent_usage")
    op.execute(
        "ALTER TABLE agent_run DROP COLUMN input_tokens, DROP COLUMN output_tokens, "
        "DROP COLUMN cost"
    )
