"""The worker runtime: claim runs, drive their steps, renew at every step boundary, recover.

At each step boundary the lease is renewed and the step's event appended in one store operation
(one statement on PostgreSQL) that appends only if the renewal held, so a holder that lost its
lease never appends. With group commit (the default) the boundaries and ends of the runs in
flight are written together, each under its own fence (:mod:`agentruns.app.settler`).
A lost lease stops the run without settling it (``LEASE_LOST``): it belongs to its new holder,
or to the reaper. A failure is classified (the kind's classifier first) and the pure recovery
decision applied: dead-letter, or a charged requeue after the kind's backoff (or the wait the
provider asked for); either way the failed attempt is recorded on the run in the same
transaction (ADRs/0014). A run whose kind is not registered here (leased through another
registry) is a failure of class ``unknown_kind``: given back without spending an attempt, for a
holder that knows the kind. Each attempt logs one line when it starts and one when it ends, with
its duration; its spans (claim, steps, end) go to the tracing port. With a holder store, the
loop keeps the worker's holder row beside it (:mod:`agentruns.app.holders`). A kind of
:class:`~agentruns.app.recorded.RecordedSteps` reads its recorded steps once when claimed again
and replays them (ADRs/0022); each step's work is bounded by its kind's step timeout
(:mod:`agentruns.app.boundaries`). While a step runs long, the worker's lease keeper renews its
lease in the background with the group, and stops the step (its task cancelled, the run ended
as lost, or cancelled) when a renewal finds the lease lost or a cancel is heard; what the step
does on cancellation is bounded by ``cancel_grace`` (:mod:`agentruns.app.keeper`, ADRs/0023).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from agentruns.app.boundaries import StepBoundaries
from agentruns.app.claimer import GroupClaimer
from agentruns.app.holders import HolderHeartbeat
from agentruns.app.keeper import LeaseKeeper
from agentruns.app.kinds import RunKind, RunKinds, RunResult, StepEvent
from agentruns.app.metrics import Metrics, NoMetrics
from agentruns.app.ports import Clock, HolderStore, NewFailure, Notifier
from agentruns.app.recorded import RecordedSteps, RunWaiting, StepContext
from agentruns.app.runs import AgentRuns
from agentruns.app.settler import GroupSettler
from agentruns.app.tracing import NoTracing, RunTrace, Tracing
from agentruns.domain.backoff import RandomSource
from agentruns.domain.errors import (
    AgentRunsError,
    LeaseLost,
    RunNotFound,
    StoreUnavailable,
    UnknownKind,
    UnknownLimit,
)
from agentruns.domain.failure_records import FailureDetail, describe_failure
from agentruns.domain.failures import ClassifiedFailure, FailureClass
from agentruns.domain.holders import HolderBeat
from agentruns.domain.payload import JsonObject, JsonValue
from agentruns.domain.recorded_steps import RECORDED_STEP, RecordedStep, Replay, read_record
from agentruns.domain.run import AgentRun
from agentruns.domain.termination import (
    EndRun,
    GiveBack,
    RequeueRun,
    RunOutcome,
    TerminationReason,
    decide_recovery,
)

log = logging.getLogger("agentruns.worker")

# The most runs one claim of the worker loop asks for (ADRs/0019).
MAX_CLAIM = 256


@dataclass
class WorkerStats:
    """What a worker did, by outcome (read by tests, the demo and metrics)."""

    outcomes: dict[RunOutcome, int] = field(default_factory=dict)
    claimed: int = 0

    def count(self, outcome: RunOutcome) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


class Worker:
    def __init__(
        self,
        runs: AgentRuns,
        kinds: RunKinds,
        notifier: Notifier,
        rng: RandomSource,
        *,
        holder: str,
        concurrency: int = 8,
        poll_interval: float = 2.0,
        only_kinds: list[str] | None = None,
        metrics: Metrics | None = None,
        group_commit: bool = True,
        tracing: Tracing | None = None,
        holders: HolderStore | None = None,
        renewal: timedelta = timedelta(seconds=10),
        process: str = "python",
        cancel_grace: float = 5.0,
        heartbeat: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("a worker needs a concurrency of at least 1")
        # The heartbeat through long steps and the stop of a lost or cancelled run's step
        # (ADRs/0023): ``cancel_grace`` bounds what a cancelled step does before it is cancelled
        # again; ``heartbeat`` is how often the keeper looks (default: a tenth of the shortest
        # lease in flight, at most 1 s); ``clock``, a clock it also reads (the test kit's).
        self.keeper = LeaseKeeper(
            runs,
            notifier,
            group_commit=group_commit,
            grace=cancel_grace,
            interval=heartbeat,
            clock=clock,
            metrics=metrics,
        )
        # With a holder store, run() keeps this worker's holder row (agentruns.app.holders):
        # written at start and about every `renewal`, marked stopped on a clean stop.
        self._holders = holders
        self._renewal = renewal
        self._process = process
        self._runs = runs
        self._kinds = kinds
        self._notifier = notifier
        self._rng = rng
        self.holder = holder
        self._concurrency = concurrency
        self._poll_interval = poll_interval
        self._only_kinds = only_kinds
        self._metrics = metrics or NoMetrics()
        self._tracing = tracing or NoTracing()
        self._running: set[asyncio.Task[RunOutcome]] = set()
        self._slot_freed = asyncio.Event()  # set by every run that ends
        self.stats = WorkerStats()
        # The error of the last claim of the loop, None once a claim succeeds: a draining worker
        # that stops on it may leave runs it could not claim.
        self.claim_error: Exception | None = None
        # Step boundaries and ends of concurrently running runs share transactions (ADRs/0011),
        # with every other worker's on the same AgentRuns (ADRs/0017).
        self._group_commit = group_commit
        # The loop claims its free slots in cohorts of at most half its slots (and MAX_CLAIM):
        # while one cohort's writes are at the server, the next is claimed and stepped, so the
        # process and the server work at the same time instead of taking turns (ADRs/0019).
        self._claim_size = max(1, min(MAX_CLAIM, concurrency // 2))
        # Concurrent claim_and_drive calls of this worker share one claim statement.
        self._claimer = GroupClaimer(self._claim_now, max_limit=max(64, concurrency))
        # How long until the soonest empty provider limit of a kind it could not claim refills
        # (ADRs/0032): the loop idles no longer than that.
        self._limit_wait: float | None = None

    async def drive(self, run: AgentRun, *, claim_seconds: float = 0.0) -> RunOutcome:
        """Run a leased run's steps to its outcome (``claim_seconds``: how long the claim that
        leased it took, for its claim span)."""
        trace = self._tracing.run(run, claim_seconds)
        started = time.perf_counter()
        # The lines' context is built only when they are written: a short run pays for it.
        logging_runs = log.isEnabledFor(logging.INFO)
        if logging_runs:
            log.info(
                "run started",
                extra={**_context(run), "attempt": run.attempt, "holder": self.holder},
            )
        failure: FailureDetail | None = None
        # The process's group for this event loop, looked up once per run, not per write.
        settler = GroupSettler.shared(self._runs) if self._group_commit else None
        kind: RunKind | None = None
        try:
            # Inside the try: a run of a kind not registered here (leased through another
            # registry's claim, or by claim_subject) is a failure to recover from like a step's,
            # never an error that kills this task with the run still leased.
            kind = self._kinds.get(run.kind)
            result = await self._steps(run, kind, trace, settler)
            span = trace.end()
            try:
                await self._end(run, kind, TerminationReason.COMPLETED, settler, result)
            finally:
                span.end()
            self._metrics.ended(run.kind, TerminationReason.COMPLETED)
            outcome = RunOutcome.COMPLETED
        except RunWaiting:
            # Given back to wait or sleep (ADRs/0025): neither a failure nor an end.
            outcome = RunOutcome.WAITING
        except LeaseLost:
            outcome = await self._lost(run)
        except StoreUnavailable:
            outcome = self._unreachable(run)
        except Exception as error:  # a step failed: classify it, record it and recover
            outcome, failure = await self._recover(run, kind, error, trace)
        seconds = time.perf_counter() - started
        trace.close(outcome, failure)
        self._metrics.finished(run.kind, outcome, seconds)
        if logging_runs:
            log.info(
                "run %s",
                outcome,
                extra={
                    **_context(run),
                    "outcome": str(outcome),
                    "duration_seconds": round(seconds, 6),
                },
            )
        self.stats.count(outcome)
        return outcome

    async def _steps(
        self, run: AgentRun, kind: RunKind, trace: RunTrace, settler: GroupSettler | None
    ) -> JsonValue:
        """Each step's work, then its boundary (renew, then persist its event), each timed and
        spanned; the run's result, if its steps gave one (ADRs/0026). A step's own error ends
        its span marked with the failure and goes on up."""
        boundary = StepBoundaries(self._runs, self._metrics, run, kind, trace, settler)
        keeper = self.keeper
        keeper.watch(boundary)
        try:
            if isinstance(kind.steps, RecordedSteps):
                return await self._recorded(run, kind.steps, boundary)
            # A generator's steps, each through the boundaries' parts, inline in this coroutine
            # (the worker's hot path: no coroutine of its own per run, ADRs/0023).
            steps = kind.steps(run)
            bounded = kind.policy.step_timeout is not None
            fence = run.fence
            while True:
                if bounded:  # the step timeout's bound needs the boundaries' own loop
                    stepped = await boundary.steps(steps.__anext__, once=True)
                    if stepped is None:
                        return None
                    if type(stepped) is RunResult:
                        await _close(steps)
                        return stepped.result
                    continue
                span = boundary.begin()
                try:
                    event = await anext(steps)
                except StopAsyncIteration:
                    boundary.working = None
                    span.drop()  # no step: the steps were done
                    return None
                except BaseException as error:
                    replaced = boundary.failed(span, error)
                    if replaced is error:
                        raise
                    raise replaced from None
                if type(event) is RunResult:  # the run's result: not a step, the steps' end
                    boundary.working = None
                    span.drop()
                    await _close(steps)
                    return event.result
                began = boundary.worked(span)
                try:
                    if settler is not None:
                        await settler.step_boundary(fence, event.type, event.data, event.usage)
                    else:
                        await self._runs.step_boundary(
                            fence, event.type, event.data, usage=event.usage
                        )
                finally:
                    span.end()
                boundary.written(began, event.usage)
        finally:
            keeper.forget(boundary)

    async def _recorded(
        self, run: AgentRun, steps: RecordedSteps, boundary: StepBoundaries
    ) -> JsonValue:
        """A recorded kind's attempt: its recorded steps read once (none before a second
        claim: a first attempt has no history and reads nothing), then its code, whose recorded
        steps return their results and whose new steps are recorded (ADRs/0022)."""
        history: list[RecordedStep] = []
        if run.epoch > 1:
            history = [
                read_record(event.data)
                for event in await self._runs.events(run.id)
                if event.type == RECORDED_STEP
            ]
        replay = Replay(history)

        async def record(label: str, work: Callable[[], Awaitable[StepEvent]]) -> JsonObject:
            return (await boundary.step(work, label)).data

        async def wait(name: str | None, occurrence: int, longest: timedelta) -> JsonObject | None:
            record = await self._runs.wait_point(
                run.fence, name=name, occurrence=occurrence, longest=longest
            )
            self._metrics.waited(run.kind, came_to(record))
            return record

        async def inputs() -> list[JsonObject]:
            return await self._runs.inputs(run.id)

        async def take(name: str, requests: int, tokens: int, longest: timedelta | None) -> None:
            await self._runs.take(name, requests=requests, tokens=tokens, wait=longest)

        result = await steps.function(run, StepContext(run, replay, record, wait, inputs, take))
        replay.finish()
        return result

    def _unreachable(self, run: AgentRun) -> RunOutcome:
        """The store cannot be reached: the holder cannot prove its lease, so it stops without
        settling, and the reaper takes the run back once the lease runs out."""
        log.error("store unavailable; the run is left to lease expiry", extra=_context(run))
        return RunOutcome.LEASE_LOST

    async def _recover(
        self, run: AgentRun, kind: RunKind | None, error: Exception, trace: RunTrace
    ) -> tuple[RunOutcome, FailureDetail]:
        """Classify the failure (``kind`` is None when the run's kind is not registered here:
        class ``unknown_kind``), record it, and apply the domain's recovery decision."""
        if kind is None:
            verdict = ClassifiedFailure(FailureClass.UNKNOWN_KIND)
            budget = run.attempt  # the kind's budget is unknown here; the decision needs none
        else:
            verdict = kind.classify(error)
            budget = kind.policy.retry_budget
            if verdict.failure_class in _PAUSING:
                verdict = await self._paused(run, kind, error, verdict)
        detail = describe_failure(error, verdict.failure_class, run.payload)
        if verdict.retry_after is not None:
            detail = replace(detail, retry_after=verdict.retry_after)
        decision = decide_recovery(verdict.failure_class, run.attempt, budget)
        log.warning(
            "step failed: %s: %s" if kind is not None else "cannot run: %s: %s",
            detail.error_type,
            detail.message,
            extra={
                **_context(run),
                "attempt": run.attempt,
                "error_type": detail.error_type,
                "failure_class": str(detail.failure_class),
                "traceback": detail.traceback,
            },
        )
        record = NewFailure(run.id, run.epoch, detail)
        span = trace.end()
        try:
            match decision:
                case EndRun(reason=reason):
                    # Alone, not with the group: a failure is rare, and its record goes in the
                    # end's own transaction.
                    await self._runs.end(run.fence, reason, failure=record)
                    self._metrics.ended(run.kind, reason)
                    return RunOutcome.FAILED, detail
                case RequeueRun(attempt=attempt) if kind is not None:
                    delay = kind.policy.backoff.retry_delay(attempt, self._rng, verdict.retry_after)
                    await self._runs.requeue(run.fence, charged=True, delay=delay, failure=record)
                    self._metrics.requeued(run.kind)
                    return RunOutcome.REQUEUED, detail
                case RequeueRun():
                    raise AssertionError("a charged requeue needs the run's kind")
                case GiveBack(delay=delay):
                    await self._runs.requeue(run.fence, charged=False, delay=delay, failure=record)
                    self._metrics.requeued(run.kind)
                    return RunOutcome.REQUEUED, detail
        except LeaseLost:
            return await self._lost(run), detail
        except StoreUnavailable:
            return self._unreachable(run), detail
        except UnknownKind:
            # Its kind keeps a domain row that only its handler may move: the run is left to
            # lease expiry, for a reaper that registers the kind.
            log.error(
                "cannot give back a run whose kind keeps a domain row this process does not know; "
                "the run is left to lease expiry",
                extra=_context(run),
            )
            return RunOutcome.LEASE_LOST, detail
        finally:
            span.end()

    async def _end(
        self,
        run: AgentRun,
        kind: RunKind,
        reason: TerminationReason,
        settler: GroupSettler | None,
        result: JsonValue = None,
    ) -> None:
        """End the run (with its ``result``) with the group, unless its kind has a domain row:
        then alone, so its handler locks that row first and moves it in the same transaction."""
        if settler is not None and not kind.handler.has_domain_row:
            await settler.end(run.fence, reason, result)
        else:
            await self._runs.end(run.fence, reason, result=result)

    async def _lost(self, run: AgentRun) -> RunOutcome:
        """A lost lease; CANCELLED when the loss was a cancel of this very epoch."""
        try:
            now = await self._runs.get(run.id)
        except (RunNotFound, StoreUnavailable):
            now = None
        if (
            now is not None
            and now.epoch == run.epoch
            and now.end_reason is TerminationReason.CANCELLED
        ):
            return RunOutcome.CANCELLED
        self._metrics.lease_lost(run.kind)
        return RunOutcome.LEASE_LOST

    async def claim_and_drive(self, limit: int) -> int:
        """Claim up to ``limit`` runs and drive them all to their outcome; how many it claimed."""
        claimed, seconds = await self._claim(limit)
        self.stats.claimed += len(claimed)
        await asyncio.gather(*(self.drive(run, claim_seconds=seconds) for run in claimed))
        return len(claimed)

    async def run(self, stop: asyncio.Event, *, grace: float = 30.0, drain: bool = False) -> None:
        """Claim and drive runs until ``stop`` is set; then stop claiming, give running steps
        ``grace`` seconds to finish, and leave the rest to lease expiry and the reaper. With
        ``drain``, also stop once nothing is due and nothing runs (a run requeued for later
        stays queued), or once a claim fails with nothing running: then :attr:`claim_error`
        says why, and runs may be left that it could not claim. With a holder store, the
        worker's heartbeat runs beside the loop, and a clean stop marks the holder stopped."""
        if self._holders is None:
            await self._loop(stop, grace, drain)
            return
        beat = HolderBeat(self.holder, self._process, tuple(self._claim_kinds()), self._renewal)
        async with HolderHeartbeat(self._runs.stores.scope, self._holders, beat).kept():
            await self._loop(stop, grace, drain)

    async def _loop(self, stop: asyncio.Event, grace: float, drain: bool) -> None:
        running = self._running
        # Listen before the first claim: a run queued between that claim and the first wait
        # would otherwise wake nobody until the poll interval.
        await self._notifier.listen()
        while not stop.is_set():
            free = min(self._concurrency - len(running), self._claim_size)
            claimed: list[AgentRun] = []
            seconds = 0.0
            if free > 0:
                try:
                    claimed, seconds = await self._claim(free)
                except Exception as error:  # a failing claim must not kill the worker
                    self.claim_error = error
                    _claim_failed(error, drain=drain and not running)
                else:
                    self.claim_error = None
            self.stats.claimed += len(claimed)
            for run in claimed:
                task = asyncio.create_task(self.drive(run, claim_seconds=seconds))
                running.add(task)
                task.add_done_callback(self._freed)
            if drain and not claimed and not running:
                break
            if claimed and len(running) < self._concurrency:
                continue
            await self._idle(stop, running, any_end=drain)
        if stop.is_set():
            # Said at the signal, not only at the end: a stop can take the whole grace.
            log.info(
                "worker draining: no longer claiming, waiting up to %gs for %d run(s) in flight",
                grace,
                len(running),
                extra={"holder": self.holder, "in_flight": len(running), "grace_seconds": grace},
            )
        if running:
            # While the runs in flight finish, the notifier is still read: a cancel sent during
            # the grace still reaches its step (ADRs/0023); wake-ups are let go.
            hearing = asyncio.create_task(self._hear_cancels())
            try:
                _, pending = await asyncio.wait(running, timeout=grace)
            finally:
                hearing.cancel()
                await asyncio.gather(hearing, return_exceptions=True)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _hear_cancels(self) -> None:
        while True:
            await self._notifier.wait(self._poll_interval)

    def _freed(self, task: asyncio.Task[RunOutcome]) -> None:
        self._running.discard(task)
        self._slot_freed.set()
        if not task.cancelled() and (error := task.exception()) is not None:
            # drive recovers from every failure it can; what escapes it is a bug, said once
            # here rather than as "Task exception was never retrieved". The run stays leased
            # until the reaper takes it back.
            log.error("a run's task failed", exc_info=error)

    def abandon(self) -> None:
        """Drop every run in flight at once, settling nothing, as a crashed process would: the
        leases run out and the reaper takes the runs back. For fault injection (the demo)."""
        for task in list(self._running):
            task.cancel()

    async def _paused(
        self, run: AgentRun, kind: RunKind, error: Exception, verdict: ClassifiedFailure
    ) -> ClassifiedFailure:
        """A 429 or 5xx: its Retry-After read again on the store's clock (an HTTP date counts from
        now), and, for a kind that draws from provider limits, those limits paused until then for
        every worker (ADRs/0032). A store it cannot reach pauses nothing: the requeue says more."""
        try:
            async with self._runs.stores.scope.statement() as tx:
                now = await self._runs.stores.runs.now(tx)
            verdict = kind.classify(error, now)
            if verdict.retry_after is not None and verdict.retry_after > 0:
                until = now + timedelta(seconds=verdict.retry_after)
                for name in kind.policy.limits:
                    await self._pause(name, until)
        except StoreUnavailable:
            log.warning("cannot read the store's clock to pause a limit", extra=_context(run))
        return verdict

    async def _pause(self, name: str, until: datetime) -> None:
        try:
            await self._runs.pause_limit(name, until)
        except UnknownLimit:
            log.warning("a kind draws from limit %r, which is not declared", name)

    def _limited(self, kinds: list[str]) -> dict[str, tuple[str, ...]]:
        """The provider limits each of ``kinds`` draws from, for those that draw from any."""
        found: dict[str, tuple[str, ...]] = {}
        for name in kinds:
            if name in self._kinds and (names := self._kinds.get(name).policy.limits):
                found[name] = names
        return found

    def _claim_kinds(self) -> list[str]:
        # Only what this worker can run: its given kinds, else every kind registered now (a
        # kind is registered before workers start). With no kind at all it claims nothing.
        return self._only_kinds if self._only_kinds is not None else self._kinds.names()

    async def _claim_now(self, limit: int) -> list[AgentRun]:
        kinds = self._claim_kinds()
        limited = self._limited(kinds)
        if not limited:
            self._limit_wait = None
            return await self._runs.claim(self.holder, limit=limit, kinds=kinds)
        # A run of a kind whose provider limit is empty or paused is not claimed (no attempt
        # spent, as under a budget hold): the limits are read in the claim's own statement.
        claimed, empty = await self._runs.claim_with_room(
            self.holder, limit=limit, kinds=kinds, limited=limited
        )
        self._limit_wait = min(wait.total_seconds() for wait in empty.values()) if empty else None
        return claimed

    async def _claim(self, limit: int) -> tuple[list[AgentRun], float]:
        started = time.perf_counter()
        claimed = await self._claimer.claim(limit)
        seconds = time.perf_counter() - started
        self._metrics.claimed(claimed, seconds)
        return claimed, seconds

    async def _idle(
        self, stop: asyncio.Event, running: set[asyncio.Task[RunOutcome]], *, any_end: bool
    ) -> None:
        """Wait for a wake-up, a free slot, the stop signal or the poll interval; with
        ``any_end``, for the end of any running run too (a draining worker checks again)."""
        waiters: set[asyncio.Future[object]] = {
            asyncio.ensure_future(stop.wait()),
            asyncio.ensure_future(self._notifier.wait(self._idle_seconds())),
        }
        if running and (any_end or len(running) >= self._concurrency):
            self._slot_freed.clear()
            waiters.add(asyncio.ensure_future(self._slot_freed.wait()))
        _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for future in pending:
            future.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _idle_seconds(self) -> float:
        """The poll interval, or less: until the soonest empty limit refills (ADRs/0032)."""
        wait = self._limit_wait
        return self._poll_interval if wait is None else max(0.001, min(wait, self._poll_interval))


# A provider asking to wait: what pauses a kind's limits (with a Retry-After).
_PAUSING = frozenset({FailureClass.RATE_LIMITED, FailureClass.SERVER_ERROR})


async def _close(steps: AsyncIterator[StepEvent]) -> None:
    """Close a generator's steps that gave the run's result: its ``finally`` runs now."""
    if isinstance(steps, AsyncGenerator):
        await steps.aclose()


def came_to(record: JsonObject | None) -> str:
    """What a holder's wait came to, from the record it resolved into (None: given back)."""
    if record is None:
        return "waiting"
    result = record.get("result")
    if isinstance(result, dict):
        if result.get("timed_out") is True:
            return "timed_out"
        if result.get("slept") is True:
            return "slept"
    return "signalled"


def _claim_failed(error: Exception, *, drain: bool) -> None:
    """One line for a failed claim: an agentruns error (a translated driver error, a refusal)
    says all it knows in its message; anything else is a bug, with its traceback."""
    then = "the drain stops" if drain else "retrying after the poll interval"
    if isinstance(error, AgentRunsError):
        log.error("claim failed; %s: %s", then, error)
    else:
        log.error("claim failed; %s", then, exc_info=error)


def _context(run: AgentRun) -> dict[str, object]:
    return {
        "run_id": str(run.id),
        "kind": run.kind,
        "workspace": run.workspace,
        "subject": run.subject,
        "epoch": run.epoch,
    }
