"""The domain's choice for an enqueue on a subject with active runs (ADRs/0028), table-tested."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from agentruns.domain.bands import Band
from agentruns.domain.errors import InvalidPayload, InvalidRequest, SubjectBusy
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.subject_policy import (
    MERGED,
    Insert,
    Join,
    OnActive,
    active,
    check_merged,
    debounced_due,
    decide,
    inputs,
    joinable,
)
from agentruns.domain.termination import TerminationReason
from agentruns.domain.waits import Signal

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
    assert decide(policy, [], kind="chat") == Insert()
    assert decide(policy, [ENDED], kind="chat") == Insert()


def test_queue_inserts_behind_the_active_runs() -> None:
    assert decide(OnActive.QUEUE, [QUEUED, LEASED], kind="chat") == Insert()


def test_reject_names_the_leased_run_first() -> None:
    with pytest.raises(SubjectBusy, match=f"active run {LEASED.id} .* and 1 more") as busy:
        decide(OnActive.REJECT, [QUEUED, LEASED, ENDED], kind="chat")
    assert busy.value.run_id == LEASED.id


def test_interrupt_ends_every_active_run_leased_first() -> None:
    assert decide(OnActive.INTERRUPT, [QUEUED, ENDED, LEASED], kind="chat") == Insert(
        (LEASED, QUEUED)
    )
    assert active([QUEUED, ENDED, LEASED]) == [LEASED, QUEUED]


@pytest.mark.parametrize(
    ("given", "parsed"),
    [("queue", OnActive.QUEUE), (" Reject ", OnActive.REJECT), (OnActive.INTERRUPT, "interrupt")],
)
def test_a_policy_parses_from_its_name(given: object, parsed: OnActive) -> None:
    assert OnActive.parse(given) is OnActive(parsed)


@pytest.mark.parametrize("given", ["rollback", "", None, 1])
def test_anything_else_is_refused(given: object) -> None:
    with pytest.raises(InvalidRequest, match="on_active is one of queue, reject, interrupt, merge"):
        OnActive.parse(given)


WAITING = replace(QUEUED, id=uuid4(), epoch=1, waiting_until=NOW + timedelta(hours=1))
REQUEUED = replace(QUEUED, id=uuid4(), epoch=1, seq=3)


@pytest.mark.parametrize(
    ("run", "joins"),
    [(QUEUED, True), (LEASED, False), (ENDED, False), (WAITING, False), (REQUEUED, False)],
    ids=["never claimed", "leased", "ended", "waiting", "requeued"],
)
def test_only_a_queued_run_never_claimed_is_joinable(run: AgentRun, joins: bool) -> None:
    assert joinable(run) is joins
    assert decide(OnActive.MERGE, [run], kind="chat") == (Join(run) if joins else Insert())


def test_merge_joins_the_newest_active_run_only() -> None:
    behind = replace(QUEUED, id=uuid4(), seq=5)
    assert decide(OnActive.MERGE, [LEASED, QUEUED, behind], kind="chat") == Join(behind)
    # the newest was claimed once: the older never-claimed run is not joined out of order
    assert decide(OnActive.MERGE, [QUEUED, REQUEUED], kind="chat") == Insert()
    assert decide(OnActive.MERGE, [QUEUED], kind="other") == Insert()


def test_a_debounce_pushes_the_due_time_within_the_max_wait_and_never_earlier() -> None:
    window = timedelta(seconds=10)
    assert debounced_due(NOW, NOW, NOW + timedelta(seconds=3), window, None) == NOW + timedelta(
        seconds=13
    )
    capped = debounced_due(NOW, NOW, NOW + timedelta(seconds=50), window, timedelta(seconds=30))
    assert capped == NOW + timedelta(seconds=30)
    later = NOW + timedelta(hours=2)
    assert debounced_due(later, NOW, NOW, window, None) == later


def test_inputs_are_the_payload_then_each_merge_in_order() -> None:
    def merged(index: int) -> Signal:
        return Signal(QUEUED.id, MERGED, f"s{index}", {"m": index}, NOW, seq=index)

    other = Signal(QUEUED.id, "approval", "a", {"ok": True}, NOW, seq=9)
    first = replace(QUEUED, payload={"m": 0})
    assert inputs(first, [merged(1), other, merged(2)]) == [{"m": 0}, {"m": 1}, {"m": 2}]


def test_merged_inputs_fit_one_payload_together() -> None:
    big = replace(QUEUED, payload={"m": "x" * 600_000})
    check_merged(QUEUED, [], {"m": "small"})
    with pytest.raises(InvalidPayload, match=f"merging into run {QUEUED.id}"):
        check_merged(big, [], {"m": "y" * 600_000})
