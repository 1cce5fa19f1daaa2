"""A kind for ``agentruns worker --kinds tests.postgres.probe_kinds:KINDS``: its one step looks
at who else is connected to its database (``pg_stat_activity``) and keeps their names."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg

import agentruns


async def _look(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    url = str(run.payload["url"])
    async with await psycopg.AsyncConnection.connect(url, application_name="probe") as probe:
        cursor = await probe.execute(
            "SELECT application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        names = sorted(str(row[0]) for row in await cursor.fetchall())
    yield agentruns.StepEvent("seen", {"names": names})


PROBE = agentruns.RunKind(agentruns.RunKindPolicy(name="probe"), _look)
KINDS = agentruns.RunKinds([PROBE])
