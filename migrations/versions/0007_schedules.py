"""Schedules declared in code, and their claimed ticks.

Revision ID: 0007_schedules
Revises: 0008_review_example_out

``agent_schedule`` keeps each schedule's definition as the code declares it (synced on start),
the operator's pause, and ``next_tick_at``: the first tick no scheduler has decided yet.
``agent_schedule_tick`` holds one row per claimed tick; its key (schedule, tick_at) makes a
second replica's claim of a tick a no-op in the transaction that enqueues the tick's run
(ADRs/0015). Neither table is on the claim path.
"""

from __future__ import annotations

from alembic import op

revision = "0007_schedules"
down_revision = "0008_review_example_out"
branch_labels = None
depends_on = None

TABLES = """
CREATE TABLE agent_schedule (
    name text PRIMARY KEY,
    kind text NOT NULL,
    workspace text NOT NULL,
    subject text NOT NULL,
    band smallint NOT NULL,
    payload jsonb NOT NULL,
    cron text,
    every interval,
    timezone text NOT NULL,
    catch_up text NOT NULL,
    catch_up_limit integer NOT NULL,
    grace interval NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    next_tick_at timestamptz,
    last_tick_at timestamptz,
    last_run uuid,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    removed_at timestamptz,
    CONSTRAINT ck_agent_schedule_timing CHECK ((cron IS NULL) <> (every IS NULL)),
    CONSTRAINT ck_agent_schedule_catch_up CHECK (catch_up IN ('latest', 'all', 'none')),
    CONSTRAINT ck_agent_schedule_band CHECK (band BETWEEN 0 AND 2),
    CONSTRAINT ck_agent_schedule_catch_up_limit CHECK (catch_up_limit >= 1)
);
CREATE INDEX ix_agent_schedule_due ON agent_schedule (next_tick_at)
    WHERE NOT paused AND removed_at IS NULL;

CREATE TABLE agent_schedule_tick (
    schedule text NOT NULL REFERENCES agent_schedule (name) ON DELETE CASCADE,
    tick_at timestamptz NOT NULL,
    run_id uuid,
    enqueued_at timestamptz NOT NULL,
    CONSTRAINT pk_agent_schedule_tick PRIMARY KEY (schedule, tick_at)
);
"""


def upgrade() -> None:
    op.execute(TABLES)


def downgrade() -> None:
    op.execute("DROP TABLE agent_schedule_tick")
    op.execute("DROP TABLE agent_schedule")
