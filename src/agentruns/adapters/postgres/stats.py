"""The read model on PostgreSQL: status counts and the invariant checks, as named statements.

None of these is on the claim path; they scan what they must (a status groups the whole runs
table), which an operator's ``status`` or a demo sampling a few times a second can afford.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentruns.adapters.postgres.database import PostgresDatabase, fetch
from agentruns.adapters.postgres.runs import run_from_row
from agentruns.adapters.postgres.sql import HOLDS, NOW, RUN_COLUMNS, statement
from agentruns.app.ports import BudgetHold, Transaction
from agentruns.app.stats import ExpiredLeases, RunCount, RunStats, RunStatus
from agentruns.domain.bands import Band
from agentruns.domain.claim_order import SubjectKey
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason

STATUS_COUNTS = statement("""
SELECT state, band, workspace, end_reason, count(*) AS runs
FROM agent_run GROUP BY state, band, workspace, end_reason
ORDER BY state, band, workspace, end_reason NULLS FIRST
""")

STATUS_FACTS = statement(f"""
SELECT {NOW} AS now,
       (SELECT count(*) FROM agent_run
         WHERE state = 'leased' AND leased_until <= {NOW}) AS expired,
       (SELECT min(due_at) FROM agent_run
         WHERE state = 'queued' AND due_at <= {NOW}) AS oldest_due_at
""")

STATUS_INACTIVE = statement("SELECT id FROM agent_workspace WHERE NOT active ORDER BY id")

EXPIRED_BY_KIND = statement(f"""
SELECT kind, count(*) AS leases, min(leased_until) AS oldest FROM agent_run
WHERE state = 'leased' AND leased_until <= {NOW}
GROUP BY kind ORDER BY kind
""")

ENDED_BEFORE = statement(f"""
SELECT count(*) AS runs FROM agent_run
WHERE state = 'ended' AND ended_at < {NOW} - CAST(:older_than AS interval)
""")

LIST_RUNS = statement(f"""
SELECT {RUN_COLUMNS} FROM agent_run
WHERE (CAST(:state AS text) IS NULL OR state = CAST(:state AS text))
  AND (CAST(:holder AS text) IS NULL OR holder = CAST(:holder AS text))
ORDER BY seq LIMIT :limit
""")

DOUBLY_LEASED = statement("""
SELECT workspace, subject FROM agent_run WHERE state = 'leased'
GROUP BY workspace, subject HAVING count(*) > 1 ORDER BY workspace, subject
""")

UNSETTLED = statement("""
SELECT count(*) AS runs FROM agent_run
WHERE NOT ((state = 'ended' AND end_reason IS NOT NULL)
        OR (state = 'queued' AND due_at IS NOT NULL)
        OR (state = 'leased' AND leased_until IS NOT NULL))
""")


class PostgresRunStats(RunStats):
    def __init__(self, database: PostgresDatabase) -> None:
        self._db = database

    def _params(self, **params: Any) -> dict[str, Any]:
        return {"now": self._db.now_param(), **params}

    async def status(self, tx: Transaction) -> RunStatus:
        counts = tuple(
            RunCount(
                state=AgentRunState(row["state"]),
                band=Band(row["band"]),
                workspace=row["workspace"],
                end_reason=None
                if row["end_reason"] is None
                else TerminationReason(row["end_reason"]),
                count=row["runs"],
            )
            for row in await fetch(tx, STATUS_COUNTS, {})
        )
        facts = (await fetch(tx, STATUS_FACTS, self._params()))[0]
        holds = tuple(
            BudgetHold(row["workspace"], row["until"], row["reason"])
            for row in await fetch(tx, HOLDS, self._params())
        )
        inactive = tuple(row["id"] for row in await fetch(tx, STATUS_INACTIVE, {}))
        expired = tuple(
            ExpiredLeases(row["kind"], int(row["leases"]), row["oldest"])
            for row in await fetch(tx, EXPIRED_BY_KIND, self._params())
        )
        return RunStatus(
            now=facts["now"],
            counts=counts,
            expired_leases=facts["expired"],
            oldest_due_at=facts["oldest_due_at"],
            holds=holds,
            inactive=inactive,
            expired_by_kind=expired,
        )

    async def ended_before(self, tx: Transaction, older_than: timedelta) -> int:
        rows = await fetch(tx, ENDED_BEFORE, self._params(older_than=older_than))
        return int(rows[0]["runs"])

    async def runs(
        self,
        tx: Transaction,
        *,
        state: AgentRunState | None = None,
        holder: str | None = None,
        limit: int = 100,
    ) -> list[AgentRun]:
        params = {"state": None if state is None else str(state), "holder": holder, "limit": limit}
        return [run_from_row(row) for row in await fetch(tx, LIST_RUNS, params)]

    async def doubly_leased_subjects(self, tx: Transaction) -> list[SubjectKey]:
        return [(row["workspace"], row["subject"]) for row in await fetch(tx, DOUBLY_LEASED, {})]

    async def unsettled(self, tx: Transaction) -> int:
        rows = await fetch(tx, UNSETTLED, {})
        return int(rows[0]["runs"])
