"""The named transitions of a run: claim, renew, end, requeue, take back, continue."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from uuid import UUID

import pytest

from agentruns.domain import run as r
from agentruns.domain.bands import Band
from agentruns.domain.errors import (
    IllegalTransition,
    InvalidPayload,
    LeaseExpired,
    RetryBudgetExhausted,
    StaleEpoch,
)
from agentruns.domain.payload import validate_payload
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from tests.strategies import EPOCH

LEASE = timedelta(seconds=30)
NOW = EPOCH + timedelta(hours=1)


def queued(**changes: object) -> r.AgentRun:
    run = r.AgentRun(
        id=UUID(int=1),
        kind="review",
        workspace="ws",
        subject="review:1",
        band=Band.BATCH,
        payload={},
        state=AgentRunState.QUEUED,
        epoch=0,
        attempt=0,
        seq=1,
        enqueued_at=EPOCH,
        due_at=EPOCH,
        lease=LEASE,
    )
    return replace(run, **changes)  # type: ignore[arg-type]


def leased(epoch: int = 1, attempt: int = 0) -> r.AgentRun:
    return queued(epoch=epoch - 1, attempt=attempt).apply(
        r.claim(queued(epoch=epoch - 1, attempt=attempt), holder="w1", now=NOW)
    )


def test_a_claim_takes_the_next_epoch_and_spends_no_attempt() -> None:
    run = queued(epoch=2, attempt=1)
    after = run.apply(r.claim(run, holder="w1", now=NOW))
    assert (after.state, after.epoch, after.attempt) == (AgentRunState.LEASED, 3, 1)
    assert after.leased_until == NOW + LEASE
    assert after.holder == "w1"


def test_a_leased_or_ended_run_cannot_be_claimed() -> None:
    with pytest.raises(IllegalTransition):
        r.claim(leased(), holder="w2", now=NOW)


def test_a_renewal_pushes_the_lease_and_keeps_the_epoch() -> None:
    run = leased()
    later = NOW + timedelta(seconds=20)
    after = run.apply(r.renew(run, run.fence, now=later))
    assert after.leased_until == later + LEASE
    assert after.epoch == run.epoch


def test_a_stale_epoch_is_refused() -> None:
    run = leased(epoch=3)
    stale = r.AgentRunFence(run.id, run.workspace, 2)
    with pytest.raises(StaleEpoch):
        r.renew(run, stale, now=NOW)


def test_an_expired_lease_is_refused_whatever_its_epoch() -> None:
    run = leased()
    with pytest.raises(LeaseExpired):
        r.renew(run, run.fence, now=NOW + LEASE)


def test_a_fence_of_another_run_is_refused() -> None:
    run = leased()
    with pytest.raises(StaleEpoch):
        r.check_fence(run, r.AgentRunFence(UUID(int=99), "ws", run.epoch), NOW)


def test_an_ended_run_refuses_its_last_holder() -> None:
    run = leased()
    ended = run.apply(r.end(run, TerminationReason.CANCELLED, now=NOW, fence=None))
    with pytest.raises(StaleEpoch):
        r.renew(ended, run.fence, now=NOW)


def test_an_end_records_its_reason_and_time() -> None:
    run = leased()
    after = run.apply(r.end(run, TerminationReason.COMPLETED, now=NOW, fence=run.fence))
    assert (after.state, after.end_reason, after.ended_at) == (
        AgentRunState.ENDED,
        TerminationReason.COMPLETED,
        NOW,
    )
    assert after.leased_until is None


def test_an_ended_run_never_moves_again() -> None:
    run = queued()
    ended = run.apply(r.end(run, TerminationReason.CANCELLED, now=NOW, fence=None))
    with pytest.raises(IllegalTransition):
        r.end(ended, TerminationReason.COMPLETED, now=NOW, fence=None)
    with pytest.raises(IllegalTransition):
        r.claim(ended, holder="w", now=NOW)


def test_a_charged_requeue_spends_an_attempt_and_an_uncharged_one_does_not() -> None:
    run = leased()
    due = NOW + timedelta(seconds=10)
    charged = run.apply(
        r.requeue(run, run.fence, now=NOW, due_at=due, charged=True, retry_budget=3)
    )
    free = run.apply(r.requeue(run, run.fence, now=NOW, due_at=due, charged=False, retry_budget=3))
    assert (charged.state, charged.attempt, charged.due_at) == (AgentRunState.QUEUED, 1, due)
    assert free.attempt == 0
    assert charged.epoch == run.epoch
    assert charged.holder is None
    assert charged.leased_until is None


def test_a_charged_requeue_past_the_budget_is_refused() -> None:
    run = leased(attempt=3)
    with pytest.raises(RetryBudgetExhausted):
        r.requeue(run, run.fence, now=NOW, due_at=NOW, charged=True, retry_budget=3)


def test_a_take_back_requeues_after_backoff_and_spends_an_attempt() -> None:
    run = leased()
    later = NOW + LEASE
    after = run.apply(r.take_back(run, now=later, retry_budget=3, delay=timedelta(seconds=5)))
    assert (after.state, after.attempt, after.due_at) == (
        AgentRunState.QUEUED,
        1,
        later + timedelta(seconds=5),
    )


def test_a_take_back_at_the_budget_ends_retries_exhausted() -> None:
    run = leased(attempt=3)
    after = run.apply(r.take_back(run, now=NOW + LEASE, retry_budget=3, delay=timedelta(0)))
    assert (after.state, after.end_reason) == (
        AgentRunState.ENDED,
        TerminationReason.RETRIES_EXHAUSTED,
    )


def test_a_take_back_past_the_deadline_ends_deadline_exceeded() -> None:
    run = replace(leased(), deadline_at=NOW)
    after = run.apply(r.take_back(run, now=NOW + LEASE, retry_budget=3, delay=timedelta(0)))
    assert after.end_reason is TerminationReason.DEADLINE_EXCEEDED


def test_a_live_lease_cannot_be_taken_back() -> None:
    run = leased()
    with pytest.raises(IllegalTransition, match="not expired"):
        r.take_back(run, now=NOW, retry_budget=3, delay=timedelta(0))


def test_a_queued_run_past_its_deadline_ends() -> None:
    run = queued(deadline_at=NOW)
    after = run.apply(r.expire_queued(run, now=NOW))
    assert after.end_reason is TerminationReason.DEADLINE_EXCEEDED
    with pytest.raises(IllegalTransition):
        r.expire_queued(queued(deadline_at=NOW + LEASE), now=NOW)


def test_continue_after_keeps_the_epochs_and_spends_one_attempt() -> None:
    run = leased(epoch=2, attempt=1)
    ended = run.apply(r.end(run, TerminationReason.COMPLETED, now=NOW, fence=run.fence))
    continuation = r.continue_after(ended, retry_budget=3)
    assert continuation == r.Continuation(epoch=2, attempt=2, continues=ended.id)


def test_continue_after_is_bounded_by_the_budget() -> None:
    run = leased(attempt=3)
    ended = run.apply(r.end(run, TerminationReason.COMPLETED, now=NOW, fence=run.fence))
    with pytest.raises(RetryBudgetExhausted):
        r.continue_after(ended, retry_budget=3)
    with pytest.raises(IllegalTransition):
        r.continue_after(leased(), retry_budget=3)


def test_an_epoch_never_goes_back() -> None:
    run = leased(epoch=2)
    with pytest.raises(IllegalTransition, match="epoch"):
        run.apply(replace(run.changed(), epoch=1))


@pytest.mark.parametrize(
    "payload",
    [[1, 2], "text", {"when": object()}, {1: "x"}, {"n": float("nan")}, None],
)
def test_a_payload_that_is_not_a_json_object_is_refused(payload: object) -> None:
    with pytest.raises(InvalidPayload):
        validate_payload(payload)


def test_a_json_object_payload_is_accepted_as_a_copy() -> None:
    original = {"pr": 12, "files": ["a.py"], "meta": {"draft": False, "score": 0.5}}
    checked = validate_payload(original)
    assert checked == original
    assert checked is not original
