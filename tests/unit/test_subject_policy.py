"""The domain's choice for an enqueue on a subject with active runs (ADRs/0028), table-tested."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from uuid import uuid4

import pytest

from agentruns.domain.bands import Band
from agentruns.domain.errors import InvalidRequest, SubjectBusy
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.subject_policy import Insert, OnActive, active, decide
from agentruns.domain.termination import TerminationReason

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
QUEUED = AgentRun(
    id=uuid4(),
    kind="chat",
    workspace="acme",
    subject="c:1",
    band=Band.BATCH,
    payload={},
    state=AgentRunState.QUEUED,
    epoch=0,
    attempt=0,
    seq=2,
    enqueued_at=NOW,
    due_at=NOW,
)
LEASED = replace(QUEUED, id=uuid4(), state=AgentRunState.LEASED, epoch=1, seq=1)
ENDED = replace(
    QUEUED, id=uuid4(), state=AgentRunState.ENDED, end_reason=TerminationReason.COMPLETED, seq=0
)


@pytest.mark.parametrize("policy", list(OnActive))
def test_an_idle_subject_takes_the_new_run_whatever_the_policy(policy: OnActive) -> None:
    assert decide(policy, []) == Insert()
    assert decide(policy, [ENDED]) == Insert()


def test_queue_inserts_behind_the_active_runs() -> None:
    assert decide(OnActive.QUEUE, [QUEUED, LEASED]) == Insert()


def test_reject_names_the_leased_run_first() -> None:
    with pytest.raises(SubjectBusy, match=f"active run {LEASED.id} .* and 1 more") as busy:
        decide(OnActive.REJECT, [QUEUED, LEASED, ENDED])
    assert busy.value.run_id == LEASED.id


def test_interrupt_ends_every_active_run_leased_first() -> None:
    assert decide(OnActive.INTERRUPT, [QUEUED, ENDED, LEASED]) == Insert((LEASED, QUEUED))
    assert active([QUEUED, ENDED, LEASED]) == [LEASED, QUEUED]


@pytest.mark.parametrize(
    ("given", "parsed"),
    [("queue", OnActive.QUEUE), (" Reject ", OnActive.REJECT), (OnActive.INTERRUPT, "interrupt")],
)
def test_a_policy_parses_from_its_name(given: object, parsed: OnActive) -> None:
    assert OnActive.parse(given) is OnActive(parsed)


@pytest.mark.parametrize("given", ["merge", "", None, 1])
def test_anything_else_is_refused(given: object) -> None:
    with pytest.raises(InvalidRequest, match="on_active is one of queue, reject, interrupt"):
        OnActive.parse(given)
