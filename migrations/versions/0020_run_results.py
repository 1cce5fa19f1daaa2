"""A run's result, stored with its end (issue 25, part 3).

Revision ID: 0020_run_results
Revises: 0019_waits

- ``agent_run.result``: the JSON value a run's kind ended it with (NULL: none), written by the
  holder's fenced end in the same statement as the end, and never after (an ended run is not
  updated: ``guard_agent_run``). The claim, renewals and step boundaries do not name it
  (ADRs/0026).
- ``guard_agent_run_result``: a result only on an ended run, whoever writes (an insert or an
  update that names the column and leaves the run unended is refused).
"""

from __future__ import annotations

from alembic import op

revision = "0020_run_results"
down_revision = "0019_waits"
branch_labels = None
depends_on = None

RESULTS = """
ALTER TABLE agent_run ADD COLUMN result jsonb;

CREATE FUNCTION refuse_agent_run_result() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'agent_run %: a result is written with the run''s end, not on a % run',
        NEW.id, NEW.state
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_run_result';
END
$$;

CREATE TRIGGER guard_agent_run_result
    BEFORE INSERT OR UPDATE OF result ON agent_run FOR EACH ROW
    WHEN (NEW.result IS NOT NULL AND NEW.state <> 'ended')
    EXECUTE FUNCTION refuse_agent_run_result();
"""


def upgrade() -> None:
    op.execute(RESULTS)


def downgrade() -> None:
    op.execute("DROP TRIGGER guard_agent_run_result ON agent_run;")
    op.execute("DROP FUNCTION refuse_agent_run_result();")
    op.execute("ALTER TABLE agent_run DROP COLUMN result;")
