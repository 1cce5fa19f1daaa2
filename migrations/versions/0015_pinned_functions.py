"""Functions that plan the same on every server and resolve their names in their own schema, and
the kinds the database has seen.

Revision ID: 0015_pinned_functions
Revises: 0014_claim_lock_then_lease

**JIT off where nodes are disabled.** ``agent_claim`` runs with sequential and bitmap scans off,
and the event guard with sequential scans, hash and merge joins off. Before PostgreSQL 18 a
disabled plan node adds 1e10 to the plan's cost, which passes ``jit_above_cost``: on a packaged
PostgreSQL 15 with its default settings every claim JIT-compiled its plan (132 functions, about
530 ms for a claim that returned no row), and a drain of 200 runs took 73.6 s instead of 4.0 s.
These functions, and the set-based triggers whose statements read many rows, now run with
``jit = off``: nothing agentruns runs is long enough for compilation to pay.

**A pinned search_path.** Every function now runs with the ``search_path`` of the migration that
made it (``SET search_path FROM CURRENT``), so its unqualified names resolve in agentruns'
schema whatever the caller's ``search_path`` is (a host's repair script, a role whose default
differs).

**The kinds seen.** ``agent_kind`` holds every kind ever enqueued, written by the inserting
statement's trigger (``ON CONFLICT DO NOTHING``: an existing kind writes nothing). A worker
that knows every kind the database has seen claims through the lanes; one that does not takes
the exact kinds-restricted claim, so no worker leases a run of a kind it cannot run (ADRs/0021).
"""

from __future__ import annotations

from alembic import op

revision = "0015_pinned_functions"
down_revision = "0014_claim_lock_then_lease"
branch_labels = None
depends_on = None

KINDS = """
CREATE TABLE agent_kind (
    name text PRIMARY KEY
);
INSERT INTO agent_kind (name) SELECT DISTINCT kind FROM agent_run;
"""

# Once per inserting statement: the workspaces' rows, the kinds seen, the new heads' lanes, the
# wake-up.
INSERTED = """
CREATE OR REPLACE FUNCTION agent_run_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agent_workspace (id) SELECT DISTINCT workspace FROM inserted
        ON CONFLICT DO NOTHING;
    INSERT INTO agent_kind (name) SELECT DISTINCT kind FROM inserted
        ON CONFLICT DO NOTHING;
    INSERT INTO agent_workspace_delta (workspace, bands)
        SELECT workspace, bit_or(1 << band)::smallint FROM inserted WHERE head
        GROUP BY workspace;
    PERFORM pg_notify('agent_run', w.workspace)
        FROM (SELECT DISTINCT workspace FROM inserted) w;
    RETURN NULL;
END
$$;
"""

PINNED = """
ALTER FUNCTION agent_claim(timestamptz, interval, text, integer)
    SET jit = off SET search_path FROM CURRENT;
ALTER FUNCTION guard_agent_run_event_insert() SET jit = off SET search_path FROM CURRENT;
ALTER FUNCTION agent_lane_fold() SET jit = off SET search_path FROM CURRENT;
ALTER FUNCTION agent_run_inserted() SET jit = off SET search_path FROM CURRENT;
ALTER FUNCTION agent_run_moved() SET jit = off SET search_path FROM CURRENT;
ALTER FUNCTION agent_run_gone() SET jit = off SET search_path FROM CURRENT;
ALTER FUNCTION guard_agent_run_event_delete() SET jit = off SET search_path FROM CURRENT;
ALTER FUNCTION guard_agent_run() SET search_path FROM CURRENT;
ALTER FUNCTION refuse_agent_run_frozen() SET search_path FROM CURRENT;
ALTER FUNCTION refuse_agent_run_delete() SET search_path FROM CURRENT;
ALTER FUNCTION refuse_agent_run_event_rewrite() SET search_path FROM CURRENT;
ALTER FUNCTION guard_agent_sandbox() SET search_path FROM CURRENT;
ALTER FUNCTION agent_subject_lock(text, text) SET search_path FROM CURRENT;
ALTER FUNCTION agent_run_enqueued() SET search_path FROM CURRENT;
ALTER FUNCTION agent_run_unhead() SET search_path FROM CURRENT;
ALTER FUNCTION agent_run_requeued() SET search_path FROM CURRENT;
"""

UNPINNED = """
ALTER FUNCTION agent_claim(timestamptz, interval, text, integer)
    RESET jit RESET search_path;
ALTER FUNCTION guard_agent_run_event_insert() RESET jit RESET search_path;
ALTER FUNCTION agent_lane_fold() RESET ALL;
ALTER FUNCTION agent_run_moved() RESET ALL;
ALTER FUNCTION agent_run_gone() RESET ALL;
ALTER FUNCTION guard_agent_run_event_delete() RESET ALL;
ALTER FUNCTION guard_agent_run() RESET ALL;
ALTER FUNCTION refuse_agent_run_frozen() RESET ALL;
ALTER FUNCTION refuse_agent_run_delete() RESET ALL;
ALTER FUNCTION refuse_agent_run_event_rewrite() RESET ALL;
ALTER FUNCTION guard_agent_sandbox() RESET ALL;
ALTER FUNCTION agent_subject_lock(text, text) RESET ALL;
ALTER FUNCTION agent_run_enqueued() RESET ALL;
ALTER FUNCTION agent_run_unhead() RESET ALL;
ALTER FUNCTION agent_run_requeued() RESET ALL;
"""

# 0005's function, without the kinds (CREATE OR REPLACE resets its SET list).
FORMER_INSERTED = """
CREATE OR REPLACE FUNCTION agent_run_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agent_workspace (id) SELECT DISTINCT workspace FROM inserted
        ON CONFLICT DO NOTHING;
    INSERT INTO agent_workspace_delta (workspace, bands)
        SELECT workspace, bit_or(1 << band)::smallint FROM inserted WHERE head
        GROUP BY workspace;
    PERFORM pg_notify('agent_run', w.workspace)
        FROM (SELECT DISTINCT workspace FROM inserted) w;
    RETURN NULL;
END
$$;
"""


def upgrade() -> None:
    for block in (KINDS, INSERTED, PINNED):
        op.execute(block)


def downgrade() -> None:
    for block in (UNPINNED, FORMER_INSERTED):
        op.execute(block)
    op.execute("DROP TABLE agent_kind")
