"""The fence guard runs its function only for a write it refuses.

Revision ID: 0012_guard_when
Revises: 0011_claim_margin

``guard_agent_run`` (0001, rules of 0004 and 0005) is a row trigger on every insert and update of
a run: a claim, a renewal, an end and a head's promotion each called its PL/pgSQL function once
per row, about 19 µs of server time per call, some 70 µs per run in the throughput bench. The
function first computes whether the write is legal and returns at once when it is. That test is
now the trigger's ``WHEN`` condition, evaluated by the executor without calling PL/pgSQL; the
function runs only when the condition says the write is not legal (a ``NULL`` verdict counts as
not legal, as the function's own ``IF`` did), and raises the same named refusal as before.
Inserts get a trigger of their own, ``guard_agent_run_insert``, since an insert's condition
cannot name ``OLD`` (ADRs/0019).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0012_guard_when"
down_revision = "0011_claim_margin"
branch_labels = None
depends_on = None


def _revision(name: str) -> ModuleType:
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"agentruns_migration_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _between(text: str, start: str, end: str) -> str:
    assert text.count(start) == 1, f"the guard changed: {start!r} is not in it once"
    tail = text[text.index(start) + len(start) :]
    return tail[: tail.index(end)]


def conditions() -> tuple[str, str]:
    """The guard function's own tests of a legal insert and a legal update (0005's text)."""
    guard = _revision("0005_claim_lanes.py")._guard()
    insert = "NEW.state = 'queued'" + _between(
        guard, "IF NEW.state = 'queued'", " THEN\n            RETURN NEW;"
    )
    update = _between(guard, "    legal := ", ";\n    IF legal THEN")
    return insert, update


def upgrade() -> None:
    insert, update = conditions()
    op.execute(f"""
DROP TRIGGER guard_agent_run ON agent_run;
CREATE TRIGGER guard_agent_run BEFORE UPDATE ON agent_run FOR EACH ROW
    WHEN (NOT COALESCE({update}, false))
    EXECUTE FUNCTION guard_agent_run();
CREATE TRIGGER guard_agent_run_insert BEFORE INSERT ON agent_run FOR EACH ROW
    WHEN (NOT COALESCE({insert}, false))
    EXECUTE FUNCTION guard_agent_run();
""")


def downgrade() -> None:
    op.execute("""
DROP TRIGGER guard_agent_run_insert ON agent_run;
DROP TRIGGER guard_agent_run ON agent_run;
CREATE TRIGGER guard_agent_run BEFORE INSERT OR UPDATE ON agent_run
    FOR EACH ROW EXECUTE FUNCTION guard_agent_run();
""")
