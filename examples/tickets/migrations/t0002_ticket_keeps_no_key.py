"""A ticket keeps no foreign key to its run, which moves to agent_run_history once it ended.

Revision ID: t0002_ticket_keeps_no_key
Revises: t0001_tickets

Runs after agentruns' revision ``0030_run_history``: as the review example's r0003, the key that
would keep agentruns' reaper from moving ended runs out of ``agent_run`` goes, and a run deleted
for good (a purge, in either table) takes its ticket with it (``support_ticket_run_gone``).

Downgrading restores the key (``NOT VALID``: the tickets of runs already moved keep their rows).
"""

from __future__ import annotations

from alembic import op

revision = "t0002_ticket_keeps_no_key"
down_revision = "t0001_tickets"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE support_ticket DROP CONSTRAINT support_ticket_run_id_fkey;

CREATE FUNCTION support_ticket_run_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A lateral lookup by key: an anti-join's plan, cached while the tables were small, can
    -- read more of them per run as they grow.
    DELETE FROM support_ticket t WHERE t.run_id = ANY (ARRAY(
        SELECT g.id FROM gone_runs g
        LEFT JOIN LATERAL (SELECT a.id FROM agent_run_all a WHERE a.id = g.id LIMIT 1) a ON true
        WHERE a.id IS NULL));
    RETURN NULL;
END
$$;

CREATE TRIGGER support_ticket_run_gone AFTER DELETE ON agent_run
    REFERENCING OLD TABLE AS gone_runs
    FOR EACH STATEMENT EXECUTE FUNCTION support_ticket_run_gone();
CREATE TRIGGER support_ticket_run_gone AFTER DELETE ON agent_run_history
    REFERENCING OLD TABLE AS gone_runs
    FOR EACH STATEMENT EXECUTE FUNCTION support_ticket_run_gone();
"""

DOWNGRADE = """
DROP TRIGGER support_ticket_run_gone ON agent_run_history;
DROP TRIGGER support_ticket_run_gone ON agent_run;
DROP FUNCTION support_ticket_run_gone();
ALTER TABLE support_ticket ADD CONSTRAINT support_ticket_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES agent_run (id) ON DELETE CASCADE NOT VALID;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
