"""The subject policies' interleaving machine (tests/contract/test_policy_stateful.py) on
PostgreSQL: each example on a database of its own, the races on a real pool."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from hypothesis.stateful import run_state_machine_as_test

from agentruns.adapters.clock import ManualClock
from agentruns.adapters.postgres import close_postgres_stores, make_postgres_stores
from agentruns.app.ports import Stores
from agentruns.testing import PostgresTestServer
from tests.contract.test_policy_stateful import PolicyMachine, policy_settings
from tests.postgres_server import CHAINS


def on_postgres(server: PostgresTestServer) -> type[PolicyMachine]:
    def stores_of(clock: ManualClock) -> tuple[Stores, Callable[[], Coroutine[Any, Any, None]]]:
        database = contextlib.ExitStack()
        url = database.enter_context(server.database(CHAINS))
        stores = make_postgres_stores(url, clock, pool_size=3)

        async def close() -> None:
            await close_postgres_stores(stores)
            database.close()

        return stores, close

    class OnPostgres(PolicyMachine):
        pass

    OnPostgres.stores_of = staticmethod(stores_of)
    return OnPostgres


def test_policies_hold_under_random_interleavings_on_postgres(
    agentruns_server: PostgresTestServer,
) -> None:
    run_state_machine_as_test(on_postgres(agentruns_server), settings=policy_settings(10))
