"""The stateful machine on PostgreSQL and memory side by side: equal after every step.

Every call the machine makes on ``AgentRuns`` or the reaper goes to both backends, which share
one manual clock, the same id sequence and equally seeded randomness; each answer (a run, a list
of runs, a report, or the exception raised) must be the same, and after every step every run
must read the same on both. The invariants of the memory machine hold throughout as well. An
attempt of the recorded kind runs on each backend with its own worker: the same outcome, the
same step functions run and the same records written on both.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Coroutine
from typing import Any
from uuid import UUID

from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from agentruns.adapters.postgres import (
    close_postgres_stores,
    make_postgres_stores,
)
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.domain.errors import AgentRunsError
from agentruns.testing import PostgresTestServer
from examples.review import PostgresReviewJobs
from tests.contract.kinds import contract_kinds
from tests.contract.test_stateful import AgentRunsMachine, Side
from tests.postgres_server import CHAINS


class Twin:
    """Calls each method on both backends and insists on the same answer."""

    def __init__(self, memory: object, postgres: object) -> None:
        self._memory = memory
        self._postgres = postgres

    def __getattr__(self, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        on_memory = getattr(self._memory, name)
        on_postgres = getattr(self._postgres, name)
        if not callable(on_memory):
            return on_memory  # type: ignore[no-any-return]

        async def both(*args: Any, **kwargs: Any) -> Any:
            expected, refused = await _outcome(on_memory(*args, **kwargs))
            actual, postgres_refused = await _outcome(on_postgres(*args, **kwargs))
            assert type(refused) is type(postgres_refused), (
                f"{name}: memory raised {refused!r}, PostgreSQL {postgres_refused!r}"
            )
            assert actual == expected, f"{name}: memory gave {expected}, PostgreSQL {actual}"
            if refused is not None:
                raise refused
            return expected

        return both


async def _outcome(call: Coroutine[Any, Any, Any]) -> tuple[Any, AgentRunsError | None]:
    try:
        return await call, None
    except AgentRunsError as refused:
        return None, refused


def _ids() -> Callable[[], UUID]:
    counter = iter(range(1, 1_000_000))
    return lambda: UUID(int=next(counter))


def side_by_side(server: PostgresTestServer) -> type[AgentRunsMachine]:
    class SideBySide(AgentRunsMachine):
        def __init__(self) -> None:
            super().__init__()
            self._database: contextlib.ExitStack = contextlib.ExitStack()
            url = self._database.enter_context(server.database(CHAINS))
            memory_runs, memory_reaper = self.runs, self.reaper
            memory_runs._new_id = _ids()  # the same ids on both sides
            self.postgres = make_postgres_stores(url, self.clock, pool_size=2)
            postgres_kinds = contract_kinds(PostgresReviewJobs())
            postgres_runs = AgentRuns(
                self.postgres, postgres_kinds, random.Random(0), new_id=_ids()
            )
            postgres_reaper = AgentRunReaper(self.postgres, postgres_kinds, random.Random(0))
            self.sides.append(Side(postgres_runs, postgres_kinds, self.postgres.notifier))
            self.runs = Twin(memory_runs, postgres_runs)  # type: ignore[assignment]
            self.reaper = Twin(memory_reaper, postgres_reaper)  # type: ignore[assignment]
            self._memory_runs, self._postgres_runs = memory_runs, postgres_runs

        @invariant()
        def both_backends_read_every_run_the_same(self) -> None:
            for run_id in self.known:
                memory = self.run(self._memory_runs.get(run_id))
                postgres = self.run(self._postgres_runs.get(run_id))
                assert memory == postgres, f"memory {memory}\nPostgreSQL {postgres}"
                assert memory.payload == postgres.payload

        def teardown(self) -> None:
            self.stop_paused()  # before the stores close under them
            self.run(close_postgres_stores(self.postgres))
            super().teardown()
            self._database.close()

    return SideBySide


def test_postgres_and_memory_agree_after_every_step(
    agentruns_server: PostgresTestServer,
) -> None:
    run_state_machine_as_test(
        side_by_side(agentruns_server),
        settings=settings(
            max_examples=8,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
