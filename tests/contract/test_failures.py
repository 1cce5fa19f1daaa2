"""Failed attempts on every backend: recorded on the run, readable, kept for its life.

A failing kind's error type, message, class and traceback are visible through
``AgentRuns.failures`` and the run's last failure, on memory and PostgreSQL alike; a record is
written only under the failing attempt's epoch; the reaper records its take-backs, leaves kinds
it does not know to a replica that knows them, and says so once per interval.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from uuid import uuid4

import pytest

from agentruns.app.kinds import RunKind, RunKinds, StepEvent
from agentruns.app.ports import NewFailure, NewRun
from agentruns.app.reaper import AgentRunReaper
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.bands import Band
from agentruns.domain.errors import (
    IllegalTransition,
    LeaseExpired,
    RetryBudgetExhausted,
    RunNotFound,
    StaleEpoch,
    UnknownKind,
)
from agentruns.domain.failure_records import FailureDetail, LastFailure
from agentruns.domain.failures import ConfigurationError, FailureClass
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome, TerminationReason
from tests.contract.conftest import Backend
from tests.contract.kinds import LEASE, policy

SECRET = "the customer's private notes"


async def missing_field(run: AgentRun) -> AsyncIterator[StepEvent]:
    """A step that trips over its input: a KeyError that echoes part of the payload."""
    yield StepEvent("read", {"index": 0})
    raise KeyError(f"missing-field (given {run.payload['notes']})")


async def misconfigured(run: AgentRun) -> AsyncIterator[StepEvent]:
    raise ConfigurationError("no model configured for this workspace")
    yield StepEvent("never")  # pragma: no cover - makes this an async generator


class Overloaded(Exception):
    """A provider error only the kind's own classifier knows."""


async def overloaded(run: AgentRun) -> AsyncIterator[StepEvent]:
    raise Overloaded("try again in a minute")
    yield StepEvent("never")  # pragma: no cover


@pytest.fixture
def failing(kinds: RunKinds) -> RunKinds:
    kinds.register(RunKind(policy("flaky", retry_budget=1), missing_field))
    kinds.register(RunKind(policy("broken"), misconfigured))
    kinds.register(
        RunKind(
            policy("overloaded", retry_budget=1),
            overloaded,
            classifier=lambda error: (
                FailureClass.RATE_LIMITED if isinstance(error, Overloaded) else None
            ),
        )
    )
    return kinds


def _worker(backend: Backend, runs: AgentRuns, kinds: RunKinds) -> Worker:
    return Worker(runs, kinds, backend.stores.notifier, random.Random(3), holder="worker-f")


async def test_each_failed_attempt_is_recorded_with_type_message_class_and_traceback(
    backend: Backend, runs: AgentRuns, failing: RunKinds
) -> None:
    """Two attempts of a kind with a budget of one: two records, then RETRIES_EXHAUSTED."""
    worker = _worker(backend, runs, failing)
    run = await runs.enqueue("flaky", workspace="acme", subject="f", payload={"notes": SECRET})
    assert await worker.claim_and_drive(1) == 1
    backend.clock.advance(timedelta(minutes=10))
    assert await worker.claim_and_drive(1) == 1
    assert worker.stats.outcomes == {RunOutcome.REQUEUED: 1, RunOutcome.FAILED: 1}

    ended = await runs.get(run.id)
    assert ended.end_reason is TerminationReason.RETRIES_EXHAUSTED
    first, second = await runs.failures(run.id)
    assert [(f.epoch, f.attempt) for f in (first, second)] == [(1, 0), (2, 1)]
    for failure in (first, second):
        assert failure.error_type == "KeyError"
        assert failure.failure_class is FailureClass.UNKNOWN
        assert "missing-field (given [payload])" in failure.message
        assert failure.holder == "worker-f"
        assert "in missing_field" in failure.traceback
        assert failure.traceback.rstrip().endswith(failure.message)
        assert SECRET not in failure.message + failure.traceback
    assert first.recorded_at <= second.recorded_at
    assert ended.last_failure == second.summary


async def test_a_final_failure_ends_the_run_with_its_record(
    backend: Backend, runs: AgentRuns, failing: RunKinds
) -> None:
    worker = _worker(backend, runs, failing)
    run = await runs.enqueue("broken", workspace="acme", subject="b")
    await worker.claim_and_drive(1)
    ended = await runs.get(run.id)
    assert ended.end_reason is TerminationReason.NOT_RETRYABLE
    [failure] = await runs.failures(run.id)
    assert (failure.error_type, failure.failure_class) == (
        "agentruns.ConfigurationError",
        FailureClass.CONFIGURATION,
    )
    assert failure.message == "no model configured for this workspace"
    assert ended.last_failure is not None
    assert str(ended.last_failure) == f"{failure.error_type}: {failure.message}"


async def test_a_kinds_own_classifier_decides_the_recovery(
    backend: Backend, runs: AgentRuns, failing: RunKinds
) -> None:
    worker = _worker(backend, runs, failing)
    run = await runs.enqueue("overloaded", workspace="acme", subject="o")
    await worker.claim_and_drive(1)
    requeued = await runs.get(run.id)
    assert requeued.state is AgentRunState.QUEUED
    [failure] = await runs.failures(run.id)
    assert failure.failure_class is FailureClass.RATE_LIMITED


async def test_a_successful_run_has_no_failure(
    backend: Backend, runs: AgentRuns, worker: Worker
) -> None:
    run = await runs.enqueue("chat", workspace="acme", subject="c")
    await worker.claim_and_drive(1)
    assert await runs.failures(run.id) == []
    assert (await runs.get(run.id)).last_failure is None


def _detail(message: str = "boom") -> FailureDetail:
    return FailureDetail("RuntimeError", message, FailureClass.UNKNOWN, "Traceback ...")


async def test_a_record_needs_the_run_leased_at_its_epoch(
    backend: Backend, runs: AgentRuns
) -> None:
    """A holder whose lease moved on records nothing: the fence rolls the record back too."""
    run = await runs.enqueue("chat", workspace="acme", subject="c")
    async with backend.stores.scope.transaction() as tx:
        with pytest.raises(StaleEpoch):
            await backend.stores.runs.record_failure(tx, NewFailure(run.id, 1, _detail()))
    [leased] = await runs.claim("w")
    await runs.cancel(run.id)
    with pytest.raises(StaleEpoch):
        await runs.end(
            leased.fence,
            TerminationReason.FAILED,
            failure=NewFailure(run.id, leased.epoch, _detail()),
        )
    assert await runs.failures(run.id) == []
    assert (await runs.get(run.id)).last_failure is None


async def test_an_expired_holders_failure_rolls_back_with_its_refused_requeue(
    backend: Backend, runs: AgentRuns
) -> None:
    run = await runs.enqueue("chat", workspace="acme", subject="c")
    [leased] = await runs.claim("w")
    backend.clock.advance(LEASE)
    with pytest.raises(LeaseExpired):
        await runs.requeue(
            leased.fence, charged=True, failure=NewFailure(run.id, leased.epoch, _detail())
        )
    assert await runs.failures(run.id) == []


async def test_failures_of_an_unknown_run_is_run_not_found(runs: AgentRuns) -> None:
    with pytest.raises(RunNotFound):
        await runs.failures(uuid4())


async def test_a_purge_takes_the_failures_with_the_run(
    backend: Backend, runs: AgentRuns, failing: RunKinds
) -> None:
    worker = _worker(backend, runs, failing)
    run = await runs.enqueue("broken", workspace="acme", subject="b")
    await worker.claim_and_drive(1)
    assert len(await runs.failures(run.id)) == 1
    backend.clock.advance(timedelta(days=1))
    assert await runs.purge(timedelta(hours=1)) == 1
    with pytest.raises(RunNotFound):
        await runs.failures(run.id)


async def test_a_take_back_is_recorded_as_an_expired_lease(
    backend: Backend, runs: AgentRuns, reaper: AgentRunReaper
) -> None:
    run = await runs.enqueue("chat", workspace="acme", subject="c")
    await runs.claim("a-worker-that-died")
    backend.clock.advance(LEASE)
    await reaper.tick()
    [failure] = await runs.failures(run.id)
    assert (failure.error_type, failure.failure_class) == (
        "LeaseExpired",
        FailureClass.LEASE_EXPIRED,
    )
    assert (failure.epoch, failure.attempt, failure.holder) == (1, 0, "a-worker-that-died")
    assert "a-worker-that-died" in failure.message
    assert (await runs.get(run.id)).last_failure == failure.summary


async def test_a_reaper_leaves_a_kind_it_does_not_know_and_says_so_once_per_interval(
    backend: Backend, runs: AgentRuns, caplog: pytest.LogCaptureFixture
) -> None:
    """Its lease stays for a replica that registers the kind: no take-back, no traceback."""
    stranger = await runs.enqueue("sweep", workspace="acme", subject="s")
    known = await runs.enqueue("chat", workspace="acme", subject="c")
    await runs.claim("w", limit=2)
    backend.clock.advance(LEASE)
    chat_only = RunKinds([RunKind(policy("chat"), missing_field)])
    reaper = AgentRunReaper(
        backend.stores, chat_only, random.Random(1), orphan_log_every=timedelta(minutes=1)
    )
    with caplog.at_level(logging.WARNING, logger="agentruns.reaper"):
        first = await reaper.tick()
        second = await reaper.tick()
        backend.clock.advance(timedelta(minutes=1))
        third = await reaper.tick()
    assert (first.taken_back, first.failed, first.orphaned) == (1, 0, 1)
    assert (second.orphaned, third.orphaned) == (0, 1)
    warnings = [record for record in caplog.records if record.name == "agentruns.reaper"]
    assert len(warnings) == 2
    assert all(record.exc_info is None for record in warnings)
    assert all(getattr(record, "kind", None) == "sweep" for record in warnings)
    assert (await runs.get(stranger.id)).state is AgentRunState.LEASED
    assert (await runs.get(known.id)).state is AgentRunState.QUEUED
    async with backend.stores.scope.transaction() as tx:
        assert await backend.stores.runs.expired_kinds(tx, ["chat"]) == {"sweep": 1}


async def test_an_operator_retry_continues_a_dead_lettered_run_within_the_budget(
    backend: Backend, runs: AgentRuns, failing: RunKinds
) -> None:
    worker = _worker(backend, runs, failing)
    run = await runs.enqueue("broken", workspace="acme", subject="b", payload={"n": 1})
    await worker.claim_and_drive(1)
    retried = await runs.retry(run.id)
    assert (retried.continues, retried.attempt, retried.epoch) == (run.id, 1, 1)
    assert retried.state is AgentRunState.QUEUED
    assert retried.payload == {"n": 1}
    with pytest.raises(IllegalTransition, match=f"already continued by run {retried.id}"):
        await runs.retry(run.id)  # a second retry of the same run would do its work twice
    for _ in range(2):  # the budget of 3 allows attempts 1, 2, 3
        await worker.claim_and_drive(1)
        retried = await runs.retry(retried.id)
    await worker.claim_and_drive(1)
    with pytest.raises(RetryBudgetExhausted):
        await runs.retry(retried.id)


async def test_only_failed_work_is_retried(backend: Backend, runs: AgentRuns) -> None:
    queued = await runs.enqueue("chat", workspace="acme", subject="q")
    with pytest.raises(IllegalTransition, match="only an ended run"):
        await runs.retry(queued.id)
    await runs.cancel(queued.id)
    with pytest.raises(IllegalTransition, match="ended cancelled"):
        await runs.retry(queued.id)


async def test_a_run_of_a_kind_not_loaded_is_cancelled_unless_its_kind_keeps_a_domain_row(
    backend: Backend, runs: AgentRuns, rng: random.Random
) -> None:
    plain = await runs.enqueue("chat", workspace="acme", subject="p")
    with_row = await runs.enqueue("review", workspace="acme", subject="r")
    assert (plain.domain_row, with_row.domain_row) == (False, True)
    nothing_loaded = AgentRuns(backend.stores, RunKinds(), rng)
    cancelled = await nothing_loaded.cancel(plain.id)
    assert cancelled.end_reason is TerminationReason.CANCELLED
    with pytest.raises(UnknownKind):
        await nothing_loaded.cancel(with_row.id)
    assert (await runs.get(with_row.id)).state is AgentRunState.QUEUED


async def test_the_trace_context_is_kept_with_the_run(backend: Backend, runs: AgentRuns) -> None:
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    new = NewRun(
        id=uuid4(),
        kind="chat",
        workspace="acme",
        subject="t",
        band=Band.BATCH,
        payload={},
        lease=LEASE,
    )
    async with backend.stores.scope.transaction() as tx:
        traced = await backend.stores.runs.insert(tx, replace(new, trace_context=carrier))
        untraced = await backend.stores.runs.insert(tx, replace(new, id=uuid4(), subject="u"))
    assert (await runs.get(traced.id)).trace_context == carrier
    assert (await runs.get(untraced.id)).trace_context is None
    [claimed] = await runs.claim("w")
    assert claimed.trace_context == carrier


@pytest.mark.parametrize("path", ["claim", "kinds", "subject"])
async def test_a_claimed_run_is_the_run_as_stored_whatever_the_claim_path(
    runs: AgentRuns, path: str
) -> None:
    """Every field of a claimed run, its payload and its last failure too, is what a read of
    the run gives, whichever claim statement leased it."""
    run = await runs.enqueue(
        "chat", workspace="acme", subject="c", payload={"doc": "d-1", "n": [1, 2]}, band=Band.BATCH
    )
    [first] = await runs.claim("w")
    await runs.requeue(
        first.fence,
        charged=True,
        delay=timedelta(0),
        failure=NewFailure(run.id, first.epoch, _detail()),
    )
    match path:
        case "claim":
            [claimed] = await runs.claim("w2")
        case "kinds":
            [claimed] = await runs.claim("w2", kinds=["chat"])
        case _:
            found = await runs.claim_subject("w2", "acme", "c", kinds=["chat"])
            assert found is not None
            claimed = found
    assert (claimed.id, claimed.kind, claimed.workspace, claimed.subject, claimed.band) == (
        run.id,
        "chat",
        "acme",
        "c",
        Band.BATCH,
    )
    assert (claimed.state, claimed.epoch, claimed.attempt, claimed.holder) == (
        AgentRunState.LEASED,
        2,
        1,
        "w2",
    )
    assert claimed.payload == {"doc": "d-1", "n": [1, 2]}
    assert claimed.last_failure == LastFailure("RuntimeError", "boom", FailureClass.UNKNOWN)
    assert (claimed.seq, claimed.enqueued_at, claimed.lease) == (
        run.seq,
        run.enqueued_at,
        run.lease,
    )
    assert claimed.leased_until is not None
    assert claimed.ended_at is None
    stored = await runs.get(run.id)
    assert replace(claimed, claimed_at=stored.claimed_at) == stored
