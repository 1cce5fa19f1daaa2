"""The read model on PostgreSQL: status counts and the invariant checks, as named statements.

None of these is on the claim path; they scan what they must (a status groups the whole runs
table), which an operator's ``status`` or a demo sampling a few times a second can afford.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from agentruns.adapters.postgres.database import PostgresDatabase, fetch
from agentruns.adapters.postgres.runs import run_from_row
from agentruns.adapters.postgres.sql import HOLDS, NOW, NOW_SELECT, RUN_COLUMNS, statement
from agentruns.app.overview import (
    LOST_LEASE_CLASS,
    EndedCount,
    ExpiringLease,
    LiveCount,
    MinuteCounts,
    Overview,
    QueueWait,
    WaitingRun,
    WorkspaceLoad,
    WorkspaceLoads,
    fill_minutes,
    minutes_of,
)
from agentruns.app.ports import BudgetHold, Transaction
from agentruns.app.stats import ExpiredLeases, RunCount, RunStats, RunStatus
from agentruns.domain.bands import Band
from agentruns.domain.claim_order import SubjectKey
from agentruns.domain.holders import HeldLease, LeaseScan
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason

STATUS_COUNTS = statement("""
SELECT state, band, workspace, end_reason, count(*) AS runs
FROM agent_run_all GROUP BY state, band, workspace, end_reason
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
SELECT count(*) AS runs FROM agent_run_all
WHERE state = 'ended' AND ended_at < {NOW} - CAST(:older_than AS interval)
""")

LIST_RUNS = statement(f"""
SELECT {RUN_COLUMNS} FROM agent_run_all
WHERE (CAST(:state AS text) IS NULL OR state = CAST(:state AS text))
  AND (CAST(:holder AS text) IS NULL OR holder = CAST(:holder AS text))
ORDER BY seq LIMIT :limit
""")

DOUBLY_LEASED = statement("""
SELECT workspace, subject FROM agent_run WHERE state = 'leased'
GROUP BY workspace, subject HAVING count(*) > 1 ORDER BY workspace, subject
""")

UNSETTLED = statement("""
SELECT count(*) AS runs FROM agent_run_all
WHERE NOT ((state = 'ended' AND end_reason IS NOT NULL)
        OR (state = 'queued' AND due_at IS NOT NULL)
        OR (state = 'leased' AND leased_until IS NOT NULL))
""")


# The console's overview (ADRs/0018). Each state is read through its own partial indexes: queued
# runs by an index-only scan of the console's queued index, leased runs (few) by theirs, runs
# ended within the window by the history's end-time index (and the few ended runs agent_run still
# has, ADRs/0035: every read that may meet an ended run reads agent_run_all), failed attempts by
# their time.
OVERVIEW_LIVE = statement("""
SELECT 'queued' AS state, band, kind, count(*) AS runs FROM agent_run
WHERE state = 'queued' GROUP BY band, kind
UNION ALL
SELECT 'leased' AS state, band, kind, count(*) AS runs FROM agent_run
WHERE state = 'leased' GROUP BY band, kind
""")

OVERVIEW_ENDED = statement("""
SELECT band, kind, end_reason, date_trunc('minute', ended_at) AS minute, count(*) AS runs
FROM agent_run_all WHERE state = 'ended' AND ended_at >= :since
GROUP BY band, kind, end_reason, date_trunc('minute', ended_at)
""")

OVERVIEW_FAILURES = statement(f"""
SELECT date_trunc('minute', f.recorded_at) AS minute,
       count(*) FILTER (WHERE f.failure_class = '{LOST_LEASE_CLASS}') AS lost,
       count(*) FILTER (WHERE NOT (r.state = 'ended' AND r.epoch = f.epoch)) AS requeued
FROM agent_run_failure f JOIN agent_run_all r ON r.id = f.run_id
WHERE f.recorded_at >= :since
GROUP BY date_trunc('minute', f.recorded_at)
""")

# The claims of the window still visible on their runs, and the queue wait of those that are
# leased or ended (a requeue moves due_at); a band row has no minute, a minute row no band. The
# requeued ones are found from the window's failures, each run by its key (a lateral lookup: on
# its generic plan a semi-join read every queued run's page, 121 ms at 1,000,000 runs).
OVERVIEW_CLAIMS = statement("""
WITH claimed AS MATERIALIZED (
    SELECT band, claimed_at, due_at, true AS waited FROM agent_run
    WHERE state = 'leased' AND claimed_at >= :since
    UNION ALL
    SELECT band, claimed_at, due_at, true AS waited FROM agent_run_all
    WHERE state = 'ended' AND ended_at >= :since AND claimed_at >= :since
    UNION ALL
    SELECT r.band, r.claimed_at, r.due_at, false AS waited
    FROM (SELECT DISTINCT f.run_id FROM agent_run_failure f WHERE f.recorded_at >= :since) f
    CROSS JOIN LATERAL (
        SELECT q.band, q.claimed_at, q.due_at FROM agent_run q
        WHERE q.id = f.run_id AND q.state = 'queued' AND q.claimed_at >= :since
        LIMIT 1) r
)
SELECT date_trunc('minute', claimed_at) AS minute, CAST(NULL AS smallint) AS band,
       count(*) AS claims, CAST(NULL AS float8) AS p50, CAST(NULL AS float8) AS p95
FROM claimed GROUP BY date_trunc('minute', claimed_at)
UNION ALL
SELECT NULL AS minute, band, count(*) AS claims,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY wait) AS p95
FROM (SELECT band, extract(epoch FROM GREATEST(claimed_at - due_at, interval '0')) AS wait
      FROM claimed WHERE waited) waits
GROUP BY band
""")

OVERVIEW_EXPIRING = statement(f"""
SELECT id, kind, workspace, subject, holder, epoch, leased_until, count(*) OVER () AS total
FROM agent_run
WHERE state = 'leased' AND leased_until <= {NOW} + CAST(:soon AS interval)
ORDER BY leased_until, seq LIMIT :limit
""")

# The runs that wait (ADRs/0025), counted per workspace and the soonest ends first: both read
# ix_agent_run_waits (ddl/console.sql), partial on the waiting runs, so their cost grows with the
# waiting runs only, not with every queued run.
WAITING_BY_WORKSPACE = statement("""
SELECT workspace, count(*) AS runs FROM agent_run
WHERE state = 'queued' AND waiting_until IS NOT NULL GROUP BY workspace
""")

WAITING_SOONEST = statement("""
SELECT id, kind, workspace, subject, waiting_for, waiting_until, waiting_since FROM agent_run
WHERE state = 'queued' AND waiting_until IS NOT NULL
ORDER BY waiting_until, seq LIMIT :limit
""")

# The leases that may be quiet (the domain decides which are): renewed before a time, or held
# by a holder not among the live ones. Leased runs are few (bounded by the workers' slots) and
# read through their partial index.
HELD_LEASES = statement("""
SELECT id, kind, workspace, subject, holder, epoch, leased_until, lease FROM agent_run
WHERE state = 'leased'
  AND (leased_until - lease < :renewed_before OR holder <> ALL (CAST(:live AS text[])))
ORDER BY leased_until - lease, seq LIMIT :limit
""")

QUEUED_KINDS = statement("""
SELECT kind, count(*) AS runs FROM agent_run WHERE state = 'queued' GROUP BY kind ORDER BY kind
""")

WORKSPACE_QUEUED = statement(f"""
SELECT workspace, band, count(*) AS runs, min(due_at) FILTER (WHERE due_at <= {NOW}) AS oldest
FROM agent_run WHERE state = 'queued' GROUP BY workspace, band
""")

WORKSPACE_LEASED = statement("""
SELECT workspace, count(*) AS runs FROM agent_run WHERE state = 'leased' GROUP BY workspace
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
            BudgetHold(row["workspace"], row["until"], row["reason"], row["by_budget"])
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

    async def overview(
        self,
        tx: Transaction,
        *,
        window: timedelta,
        soon: timedelta,
        expiring: int = 20,
        waiting: int = 10,
    ) -> Overview:
        now: datetime = (await fetch(tx, NOW_SELECT, self._params()))[0]["now"]
        since = minutes_of(now, window)[0]
        live = tuple(
            LiveCount(AgentRunState(row["state"]), Band(row["band"]), row["kind"], row["runs"])
            for row in await fetch(tx, OVERVIEW_LIVE, {})
        )
        ended_rows = await fetch(tx, OVERVIEW_ENDED, {"since": since})
        ended: dict[tuple[Band, str, TerminationReason], int] = {}
        minutes: dict[datetime, dict[str, int]] = {}

        def add(minute: datetime, series: str, count: int) -> None:
            found = minutes.setdefault(minute, {})
            found[series] = found.get(series, 0) + count

        for row in ended_rows:
            reason = TerminationReason(row["end_reason"])
            key = (Band(row["band"]), row["kind"], reason)
            ended[key] = ended.get(key, 0) + row["runs"]
            if reason is TerminationReason.COMPLETED:
                add(row["minute"], "completions", row["runs"])
            elif reason.is_dead_letter:
                add(row["minute"], "dead_letters", row["runs"])
        for row in await fetch(tx, OVERVIEW_FAILURES, {"since": since}):
            add(row["minute"], "lost_leases", row["lost"])
            add(row["minute"], "requeues", row["requeued"])
        waits: dict[Band, QueueWait] = {}
        for row in await fetch(tx, OVERVIEW_CLAIMS, {"since": since}):
            if row["band"] is None:
                add(row["minute"], "claims", row["claims"])
            else:
                band = Band(row["band"])
                waits[band] = QueueWait(
                    band, row["claims"], _seconds(row["p50"]), _seconds(row["p95"])
                )
        expiring_rows = await fetch(tx, OVERVIEW_EXPIRING, self._params(soon=soon, limit=expiring))
        return Overview(
            now=now,
            window=window,
            live=tuple(sorted(live, key=lambda c: (c.state, c.band, c.kind))),
            ended=tuple(
                EndedCount(band, kind, reason, count)
                for (band, kind, reason), count in sorted(ended.items())
            ),
            minutes=fill_minutes(now, window, _minutes(minutes)),
            waits=tuple(waits.get(band, QueueWait(band, 0, None, None)) for band in Band),
            expiring=tuple(
                ExpiringLease(
                    row["id"],
                    row["kind"],
                    row["workspace"],
                    row["subject"],
                    row["holder"],
                    row["epoch"],
                    row["leased_until"],
                )
                for row in expiring_rows
            ),
            expiring_total=int(expiring_rows[0]["total"]) if expiring_rows else 0,
            soon=soon,
            expired_by_kind=tuple(
                ExpiredLeases(row["kind"], int(row["leases"]), row["oldest"])
                for row in await fetch(tx, EXPIRED_BY_KIND, self._params())
            ),
            waiting=tuple(
                WaitingRun(
                    row["id"],
                    row["kind"],
                    row["workspace"],
                    row["subject"],
                    row["waiting_for"],
                    row["waiting_until"],
                    row["waiting_since"],
                )
                for row in await fetch(tx, WAITING_SOONEST, {"limit": waiting})
            ),
            waiting_total=sum(
                int(row["runs"]) for row in await fetch(tx, WAITING_BY_WORKSPACE, {})
            ),
        )

    async def held_leases(
        self, tx: Transaction, scan: LeaseScan, *, limit: int = 500
    ) -> list[HeldLease]:
        params = {"renewed_before": scan.renewed_before, "live": list(scan.live), "limit": limit}
        return [
            HeldLease(
                row["id"],
                row["kind"],
                row["workspace"],
                row["subject"],
                row["holder"],
                row["epoch"],
                row["leased_until"],
                row["lease"],
            )
            for row in await fetch(tx, HELD_LEASES, params)
        ]

    async def queued_kinds(self, tx: Transaction) -> dict[str, int]:
        return {row["kind"]: int(row["runs"]) for row in await fetch(tx, QUEUED_KINDS, {})}

    async def workspace_loads(self, tx: Transaction) -> WorkspaceLoads:
        now: datetime = (await fetch(tx, NOW_SELECT, self._params()))[0]["now"]
        queued: dict[str, list[int]] = {}
        oldest: dict[str, datetime] = {}
        for row in await fetch(tx, WORKSPACE_QUEUED, self._params()):
            queued.setdefault(row["workspace"], [0, 0, 0])[row["band"]] = row["runs"]
            if row["oldest"] is not None:
                held = oldest.get(row["workspace"])
                oldest[row["workspace"]] = (
                    row["oldest"] if held is None else min(held, row["oldest"])
                )
        leased = {
            row["workspace"]: int(row["runs"]) for row in await fetch(tx, WORKSPACE_LEASED, {})
        }
        holds = {
            row["workspace"]: BudgetHold(
                row["workspace"], row["until"], row["reason"], row["by_budget"]
            )
            for row in await fetch(tx, HOLDS, self._params())
        }
        inactive = {row["id"] for row in await fetch(tx, STATUS_INACTIVE, {})}
        waiting = {
            row["workspace"]: int(row["runs"]) for row in await fetch(tx, WAITING_BY_WORKSPACE, {})
        }
        names = sorted(set(queued) | set(leased) | inactive | set(holds))
        return WorkspaceLoads(
            now=now,
            loads=tuple(
                WorkspaceLoad(
                    workspace=name,
                    queued=_bands(queued.get(name, [0, 0, 0])),
                    leased=leased.get(name, 0),
                    oldest_due_at=oldest.get(name),
                    active=name not in inactive,
                    hold=holds.get(name),
                    waiting=waiting.get(name, 0),
                )
                for name in names
            ),
        )


def _bands(counts: list[int]) -> tuple[int, int, int]:
    return (counts[0], counts[1], counts[2])


def _seconds(value: float | None) -> timedelta | None:
    return None if value is None else timedelta(seconds=float(value))


def _minutes(found: dict[datetime, dict[str, int]]) -> Iterable[MinuteCounts]:
    for minute, counts in found.items():
        yield MinuteCounts(minute, **{name: counts.get(name, 0) for name in MinuteCounts.SERIES})
