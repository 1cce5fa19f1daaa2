"""Test mode, public API: what a host's tests use to run its kinds in memory and on PostgreSQL.

::

    harness = agentruns.testing.harness(my_kind)                     # in memory
    harness = agentruns.testing.harness(my_kind, database_url=url)   # on PostgreSQL
    run = await harness.runs.enqueue("review", workspace="acme", subject="review:1")
    report = await harness.drain()

The pytest plugin (:mod:`agentruns.testing.plugin`, loaded by pytest when agentruns is installed)
gives ``agentruns_harness``, a factory of harnesses that runs a test once in memory and once on a
fresh PostgreSQL database. ``ManualClock`` is the time every statement reads; the memory family
and its tables are here for a host's own memory fakes of its domain rows. Names load on first
use, so the plugin costs a test session nothing until a fixture is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_HOMES: dict[str, str] = {
    "harness": "agentruns.testing._harness",
    "AgentRunsHarness": "agentruns.testing._harness",
    "DrainReport": "agentruns.testing._harness",
    "HarnessFactory": "agentruns.testing._harness",
    "PostgresTestServer": "agentruns.testing.postgres",
    "ManualClock": "agentruns.adapters.clock",
    "MemoryFamily": "agentruns.adapters.memory",
    "MemoryDatabase": "agentruns.adapters.memory",
    "MemoryTable": "agentruns.adapters.memory",
    "MemorySandboxClaims": "agentruns.adapters.memory",
    "BudgetHold": "agentruns.app.ports",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'agentruns.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers see: the same names, eagerly, re-exported
    from agentruns.adapters.clock import ManualClock as ManualClock
    from agentruns.adapters.memory import (
        MemoryDatabase as MemoryDatabase,
        MemoryFamily as MemoryFamily,
        MemorySandboxClaims as MemorySandboxClaims,
        MemoryTable as MemoryTable,
    )
    from agentruns.app.ports import BudgetHold as BudgetHold
    from agentruns.testing._harness import (
        AgentRunsHarness as AgentRunsHarness,
        DrainReport as DrainReport,
        HarnessFactory as HarnessFactory,
        harness as harness,
    )
    from agentruns.testing.postgres import PostgresTestServer as PostgresTestServer
