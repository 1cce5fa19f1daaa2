"""Run kinds: the registry, and the one question both the worker and the registry ask of a
kind's handler: does it keep a domain row?"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from agentruns.app.kinds import AgentRunHandler, NoDomainRow, RunKind, RunKinds, StepEvent
from agentruns.app.ports import BudgetHold, Transaction
from agentruns.domain.errors import InvalidRequest, UnknownKind
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.run import AgentRun, RunChange


async def _steps(run: AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("done")


class _RowKeeper(AgentRunHandler):
    """A handler with a row of its own: it says nothing about it, so the default holds."""

    async def lock_domain_row(self, tx: Transaction, run: AgentRun) -> None:
        return None

    async def on_take_back(self, tx: Transaction, run: AgentRun, change: RunChange) -> None:
        return None

    async def on_moved(self, tx: Transaction, run: AgentRun) -> None:
        return None

    async def check_budget(self, tx: Transaction, run: AgentRun) -> BudgetHold | None:
        return None


class _BudgetOnly(NoDomainRow):
    async def check_budget(self, tx: Transaction, run: AgentRun) -> BudgetHold | None:
        return None


def _kind(name: str, handler: AgentRunHandler | None = None) -> RunKind:
    if handler is None:
        return RunKind(RunKindPolicy(name), _steps)
    return RunKind(RunKindPolicy(name), _steps, handler)


@pytest.mark.parametrize(
    ("handler", "keeps_a_row"),
    [(None, False), (NoDomainRow(), False), (_BudgetOnly(), False), (_RowKeeper(), True)],
)
def test_the_registry_reads_domain_rows_from_the_handlers(
    handler: AgentRunHandler | None, keeps_a_row: bool
) -> None:
    kind = _kind("k", handler)
    assert kind.handler.has_domain_row is keeps_a_row
    kinds = RunKinds([_kind("plain"), kind])
    assert kinds.any_domain_rows is keeps_a_row


def test_a_kind_registered_later_counts_too() -> None:
    kinds = RunKinds([_kind("plain")])
    kinds.register(_kind("rows", _RowKeeper()))
    assert kinds.any_domain_rows


def test_a_kind_is_registered_once_and_an_unknown_one_is_refused() -> None:
    kinds = RunKinds([_kind("a")])
    with pytest.raises(ValueError, match="twice"):
        kinds.register(_kind("a"))
    with pytest.raises(UnknownKind):
        kinds.get("b")
    assert ("a" in kinds, "b" in kinds, kinds.names()) == (True, False, ["a"])


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(days=2), 5])
def test_a_step_timeout_is_positive_and_at_most_a_day(bad: object) -> None:
    with pytest.raises(InvalidRequest, match="a step timeout"):
        RunKindPolicy(name="k", step_timeout=bad)  # type: ignore[arg-type]
