"""A workspace budget over a rolling window (ADRs/0033, "Rolling windows").

Revision ID: 0028_rolling_budgets
Revises: 0027_usage

``agent_budget`` gains ``rolling_window`` (an interval, set exactly when the period is
``'rolling'``) and its period check admits ``'rolling'``. A rolling budget keeps no running
spend: the usage statements sum its window's rows of ``agent_usage`` through
ix_agent_usage_workspace_at, which 0027_usage already made. Adding a nullable column rewrites no
row. Downgrading removes the rolling budgets (the old check cannot hold them) and their own
holds.
"""

from __future__ import annotations

from alembic import op

revision = "0028_rolling_budgets"
down_revision = "0027_usage"
branch_labels = None
depends_on = None

WINDOW = "ALTER TABLE agent_budget ADD COLUMN rolling_window interval"

DROP_PERIOD = "ALTER TABLE agent_budget DROP CONSTRAINT ck_agent_budget_period"

PERIOD = (
    "ALTER TABLE agent_budget ADD CONSTRAINT ck_agent_budget_period "
    "CHECK (period IN ('day', 'month', 'rolling'))"
)

WINDOW_CHECK = (
    "ALTER TABLE agent_budget ADD CONSTRAINT ck_agent_budget_window "
    "CHECK ((period = 'rolling') = (rolling_window IS NOT NULL))"
)


def upgrade() -> None:
    op.execute(WINDOW)
    op.execute(DROP_PERIOD)
    op.execute(PERIOD)
    op.execute(WINDOW_CHECK)


def downgrade() -> None:
    op.execute(
        "DELETE FROM agent_budget_hold WHERE by_budget AND workspace IN "
        "(SELECT workspace FROM agent_budget WHERE period = 'rolling')"
    )
    op.execute("DELETE FROM agent_budget WHERE period = 'rolling'")
    op.execute("ALTER TABLE agent_budget DROP CONSTRAINT ck_agent_budget_window")
    op.execute(DROP_PERIOD)
    op.execute(
        "ALTER TABLE agent_budget ADD CONSTRAINT ck_agent_budget_period "
        "CHECK (period IN ('day', 'month'))"
    )
    op.execute("ALTER TABLE agent_budget DROP COLUMN rolling_window")
