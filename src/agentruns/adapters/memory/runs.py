"""The runs table in memory: the domain's transitions applied to a dict, inside a transaction."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from uuid import UUID

from agentruns.adapters.memory.database import MemoryDatabase, MemoryTable
from agentruns.adapters.memory.limits import MemoryLimitStore
from agentruns.adapters.memory.notifier import MemoryNotifier
from agentruns.adapters.memory.workspaces import MemoryWorkspaceStore
from agentruns.app.ports import (
    ClaimRequest,
    Clock,
    EndWrite,
    EventLog,
    NewFailure,
    NewRun,
    RunEvent,
    RunQuery,
    RunStore,
    StepWrite,
    TakeBack,
    Transaction,
)
from agentruns.domain import run as transitions, subject_policy, usage as usage_rules, waits
from agentruns.domain.claim_order import ClaimContext, next_claims
from agentruns.domain.errors import (
    AgentRunsError,
    IllegalTransition,
    LeaseLost,
    RunNotFound,
)
from agentruns.domain.failure_records import FailureRecord
from agentruns.domain.payload import JsonObject, JsonValue
from agentruns.domain.provider_limits import drawn_from, with_room
from agentruns.domain.run import AgentRun, AgentRunFence
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from agentruns.domain.usage import Per, Spend, Usage, UsageRecord, WorkspaceSpend
from agentruns.domain.waits import Delivered, Signal


class MemoryRunStore(RunStore):
    def __init__(
        self,
        database: MemoryDatabase,
        clock: Clock,
        workspaces: MemoryWorkspaceStore,
        notifier: MemoryNotifier,
    ) -> None:
        self._database = database
        self._clock = clock
        self._workspaces = workspaces
        self._notifier = notifier
        # The family's limit store (set once both exist): a claim with room asks it.
        self.limits: MemoryLimitStore | None = None
        self.rows: MemoryTable[UUID, AgentRun] = MemoryTable(database)
        # Like a PostgreSQL sequence, queue order is not given back on rollback.
        self._seq = itertools.count(1)
        self._failures: MemoryTable[UUID, tuple[FailureRecord, ...]] = MemoryTable(database)
        self._failure_ids = itertools.count(1)
        # Each enqueue key (by workspace) and the run it names, as agent_run_key holds them.
        self._keys: MemoryTable[tuple[str, str], UUID] = MemoryTable(database)
        # Each run's signals in delivery order, as agent_run_signal holds them (ADRs/0025).
        self._signals: MemoryTable[UUID, tuple[Signal, ...]] = MemoryTable(database)
        self._signal_seq = itertools.count(1)
        # The ended runs moved out of the hot path, as agent_run_history holds them (ADRs/0035):
        # one mapping serves every read here, so only the count a reaper reports depends on it.
        self._archived: MemoryTable[UUID, bool] = MemoryTable(database)

    async def now(self, tx: Transaction) -> datetime:
        self._database.check(tx)
        return self._clock.now()

    def _write(self, tx: Transaction, run: AgentRun) -> AgentRun:
        """Store ``run``; what a moving statement hands back: the run without its enqueue key
        and its wait, which PostgreSQL's claim, renewal, end and requeue do not read (ADRs/0024,
        0025), so a kind that reads ``run.key`` sees in the test kit what it sees in
        production."""
        self._stored(tx, run)
        if run.key is None and run.waiting_until is None and run.waiting_for is None:
            return run
        return replace(run, key=None, waiting_for=None, waiting_until=None, waiting_since=None)

    def _stored(self, tx: Transaction, run: AgentRun) -> None:
        self.rows.put(tx, run.id, run)
        if run.state is AgentRunState.QUEUED:
            self._database.check(tx).on_commit(self._notifier.notify)
        self.announce(tx, run.id)

    def announce(self, tx: Transaction, run_id: UUID) -> None:
        """Tell the run's watchers after the commit, as ``agent_run_watch`` does (ADRs/0030)."""
        if self._notifier.watched(run_id):
            self._database.check(tx).on_commit(lambda: self._notifier.changed(run_id))

    def _existing(self, run_id: UUID) -> AgentRun:
        run = self.rows.get(run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id}")
        return run

    async def insert(self, tx: Transaction, new: NewRun) -> AgentRun:
        self._database.check(tx)
        if self.rows.get(new.id) is not None:
            raise IllegalTransition(None, AgentRunState.QUEUED, f"run {new.id} exists already")
        now = self._clock.now()
        deadline = new.deadline_at
        if deadline is None and new.deadline_after is not None:
            deadline = now + new.deadline_after
        run = AgentRun(
            id=new.id,
            kind=new.kind,
            workspace=new.workspace,
            subject=new.subject,
            band=new.band,
            payload=new.payload,
            state=AgentRunState.QUEUED,
            epoch=new.epoch,
            attempt=new.attempt,
            seq=next(self._seq),
            enqueued_at=now,
            due_at=new.due_at or now,
            lease=new.lease,
            deadline_at=deadline,
            continues=new.continues,
            domain_row=new.domain_row,
            trace_context=None if new.trace_context is None else dict(new.trace_context),
            key=new.key,
        )
        self._stored(tx, run)
        return run

    async def insert_keyed(self, tx: Transaction, new: NewRun) -> AgentRun | None:
        self._database.check(tx)
        assert new.key is not None
        if self._keys.get((new.workspace, new.key)) is not None:
            return None
        return await self.rekey(tx, new)

    async def key_holder(
        self, tx: Transaction, workspace: str, key: str
    ) -> tuple[UUID, datetime] | None:
        self._database.check(tx)
        run_id = self._keys.get((workspace, key))
        return None if run_id is None else (run_id, self._clock.now())

    async def rekey(self, tx: Transaction, new: NewRun) -> AgentRun:
        self._database.check(tx)
        assert new.key is not None
        run = await self.insert(tx, new)
        self._keys.put(tx, (new.workspace, new.key), new.id)
        return run

    async def get(self, tx: Transaction, run_id: UUID) -> AgentRun | None:
        self._database.check(tx)
        return self.rows.get(run_id)

    async def lock_subject(self, tx: Transaction, workspace: str, subject: str) -> None:
        # Transactions run one at a time: the subject is held already.
        self._database.check(tx)

    async def active_runs(self, tx: Transaction, workspace: str, subject: str) -> list[AgentRun]:
        self._database.check(tx)
        found = [
            run
            for run in self.rows.values()
            if run.workspace == workspace
            and run.subject == subject
            and run.state is not AgentRunState.ENDED
        ]
        return sorted(found, key=lambda run: run.seq)

    async def lock(self, tx: Transaction, run_id: UUID) -> AgentRun | None:
        return await self.get(tx, run_id)

    async def list_runs(self, tx: Transaction, query: RunQuery) -> list[AgentRun]:
        self._database.check(tx)
        found = [run for run in self.rows.values() if _matches(run, query)]
        found.sort(key=lambda run: run.seq, reverse=True)
        return found[: query.limit]

    async def claim(self, tx: Transaction, request: ClaimRequest) -> list[AgentRun]:
        self._database.check(tx)
        now = self._clock.now()
        everything = list(self.rows.values())
        leased = Counter(run.workspace for run in everything if run.state is AgentRunState.LEASED)
        context = ClaimContext(
            now=now,
            band_aging=request.band_aging,
            leased_per_workspace=leased,
            excluded_workspaces=self._workspaces.excluded_at(now),
            kinds=None if request.kinds is None else frozenset(request.kinds),
            subject=request.subject,
        )
        claimed = []
        for run in next_claims(everything, context, request.limit):
            change = transitions.claim(run, holder=request.holder, now=now)
            claimed.append(self._write(tx, run.apply(change)))
        return claimed

    async def claim_with_room(
        self, tx: Transaction, request: ClaimRequest, limited: Mapping[str, tuple[str, ...]]
    ) -> tuple[list[AgentRun], dict[str, timedelta]]:
        assert request.kinds is not None, "a claim with room names its kinds"
        assert self.limits is not None, "the family gives the run store its limits"
        empty = await self.limits.empty(tx, drawn_from(limited))
        kinds = with_room(request.kinds, limited, empty)
        if not kinds:
            return [], empty
        return await self.claim(tx, replace(request, kinds=kinds)), empty

    async def require_current(self, tx: Transaction, fence: AgentRunFence) -> AgentRun:
        self._database.check(tx)
        run = self._existing(fence.run_id)
        transitions.check_fence(run, fence, self._clock.now())
        return run

    async def renew(self, tx: Transaction, fence: AgentRunFence) -> AgentRun:
        run = await self.require_current(tx, fence)
        return self._write(tx, run.apply(transitions.renew(run, fence, now=self._clock.now())))

    async def end(
        self,
        tx: Transaction,
        run_id: UUID,
        reason: TerminationReason,
        fence: AgentRunFence | None,
        result: JsonValue = None,
    ) -> AgentRun:
        database = self._database.check(tx)
        run = self._existing(run_id)
        change = transitions.end(run, reason, now=self._clock.now(), fence=fence)
        if fence is None and run.state is AgentRunState.LEASED:
            # Ended under its holder: the holder is told once the end commits (ADRs/0023).
            database.on_commit(lambda: self._notifier.cancelled(run_id))
        ended = run.apply(change)
        if fence is not None and result is not None:  # only a holder ends with a result
            ended = replace(ended, result=result)
        return self._write(tx, ended)

    async def renew_many(
        self, tx: Transaction, fences: Sequence[AgentRunFence]
    ) -> list[AgentRunsError | None]:
        results: list[AgentRunsError | None] = []
        for fence in fences:
            try:
                await self.renew(tx, fence)
            except (LeaseLost, RunNotFound) as refused:  # the domain refused before writing
                results.append(refused)
            else:
                results.append(None)
        return results

    async def end_many(
        self, tx: Transaction, ends: Sequence[EndWrite], *, ended_runs: bool = True
    ) -> list[AgentRun | AgentRunsError | None]:
        results: list[AgentRun | AgentRunsError | None] = []
        for write in ends:
            try:
                ended = await self.end(
                    tx, write.fence.run_id, write.reason, write.fence, write.result
                )
            except (LeaseLost, RunNotFound) as refused:  # the domain refused before writing
                results.append(refused)
            else:
                results.append(ended if ended_runs else None)
        return results

    async def requeue(
        self,
        tx: Transaction,
        fence: AgentRunFence,
        *,
        charged: bool,
        delay: timedelta,
        retry_budget: int,
    ) -> AgentRun:
        run = await self.require_current(tx, fence)
        now = self._clock.now()
        change = transitions.requeue(
            run, fence, now=now, due_at=now + delay, charged=charged, retry_budget=retry_budget
        )
        return self._write(tx, run.apply(change))

    async def park(
        self,
        tx: Transaction,
        fence: AgentRunFence,
        *,
        waiting_for: str | None,
        until: datetime,
        since: datetime,
    ) -> AgentRun:
        run = await self.require_current(tx, fence)
        now = self._clock.now()
        change = transitions.requeue(
            run, fence, now=now, due_at=until, charged=False, retry_budget=run.attempt
        )
        parked = replace(
            run.apply(change), waiting_for=waiting_for, waiting_until=until, waiting_since=since
        )
        return self._write(tx, parked)

    async def postpone(self, tx: Transaction, run_id: UUID, due_at: datetime) -> AgentRun:
        self._database.check(tx)
        run = self._existing(run_id)
        if not subject_policy.joinable(run) or run.due_at >= due_at:
            raise IllegalTransition(
                run.state,
                AgentRunState.QUEUED,
                f"run {run_id} is not a queued run never claimed and due before {due_at}",
            )
        return self._write(tx, replace(run, due_at=due_at))

    async def clear_wait(self, tx: Transaction, fence: AgentRunFence) -> None:
        run = await self.require_current(tx, fence)
        self.rows.put(
            tx, run.id, replace(run, waiting_for=None, waiting_until=None, waiting_since=None)
        )

    async def wake(self, tx: Transaction, run_id: UUID, name: str) -> bool:
        self._database.check(tx)
        run = self.rows.get(run_id)
        woken = None if run is None else waits.wake(run, name=name, now=self._clock.now())
        if woken is None:
            return False
        self._stored(tx, woken)
        return True

    async def deliver_signal(
        self, tx: Transaction, run_id: UUID, name: str, signal_id: str, payload: JsonValue
    ) -> Delivered:
        self._database.check(tx)
        kept = self._signals_of(run_id)
        for signal in kept:
            if signal.signal_id == signal_id:
                return Delivered(signal, created=False)
        signal = Signal(
            run_id=run_id,
            name=name,
            signal_id=signal_id,
            payload=payload,
            delivered_at=self._clock.now(),
            seq=next(self._signal_seq),
        )
        self._signals.put(tx, run_id, (*kept, signal))
        return Delivered(signal, created=True)

    async def signal_of(
        self, tx: Transaction, run_id: UUID, name: str, occurrence: int
    ) -> Signal | None:
        self._database.check(tx)
        named = [signal for signal in self._signals_of(run_id) if signal.name == name]
        return named[occurrence - 1] if 0 < occurrence <= len(named) else None

    async def signals(self, tx: Transaction, run_id: UUID) -> list[Signal]:
        self._database.check(tx)
        return list(self._signals_of(run_id))

    def _signals_of(self, run_id: UUID) -> tuple[Signal, ...]:
        # A purged run's signals go with it, as ON DELETE CASCADE does in PostgreSQL.
        if self.rows.get(run_id) is None:
            return ()
        return self._signals.get(run_id) or ()

    async def expired(
        self, tx: Transaction, limit: int, kinds: Sequence[str] | None = None
    ) -> list[AgentRun]:
        self._database.check(tx)
        now = self._clock.now()
        found = [
            run
            for run in self.rows.values()
            if run.is_expired(now) and (kinds is None or run.kind in kinds)
        ]
        found.sort(key=lambda run: (run.leased_until or now, run.seq))
        return found[:limit]

    async def expired_kinds(self, tx: Transaction, excluding: Sequence[str]) -> dict[str, int]:
        self._database.check(tx)
        now = self._clock.now()
        counted = Counter(
            run.kind
            for run in self.rows.values()
            if run.is_expired(now) and run.kind not in excluding
        )
        return dict(sorted(counted.items()))

    async def take_back(self, tx: Transaction, take_back: TakeBack) -> AgentRun | None:
        self._database.check(tx)
        run = self.rows.get(take_back.run_id)
        now = self._clock.now()
        if run is None or run.epoch != take_back.epoch or not run.is_expired(now):
            return None
        change = transitions.take_back(
            run, now=now, retry_budget=take_back.retry_budget, delay=take_back.delay
        )
        return self._write(tx, run.apply(change))

    async def take_back_many(
        self, tx: Transaction, take_backs: Sequence[TakeBack]
    ) -> list[AgentRun]:
        taken: list[AgentRun] = []
        now = self._clock.now()
        for take_back in take_backs:
            run = self.rows.get(take_back.run_id)
            if run is None or run.epoch != take_back.epoch or not run.is_expired(now):
                continue  # a renewal or another replica won: nothing written for it
            if take_back.failure is not None:
                await self.record_failure(
                    tx, NewFailure(take_back.run_id, take_back.epoch, take_back.failure)
                )
            after = await self.take_back(tx, take_back)
            if after is not None:
                taken.append(after)
        return taken

    async def overdue(
        self, tx: Transaction, limit: int, kinds: Sequence[str] | None = None
    ) -> list[AgentRun]:
        self._database.check(tx)
        now = self._clock.now()
        found = [
            run
            for run in self.rows.values()
            if run.state is AgentRunState.QUEUED
            and run.is_past_deadline(now)
            and (kinds is None or run.kind in kinds)
        ]
        found.sort(key=lambda run: (run.deadline_at or now, run.seq))
        return found[:limit]

    async def record_failure(self, tx: Transaction, failure: NewFailure) -> FailureRecord:
        self._database.check(tx)
        run = self._existing(failure.run_id)
        noted = transitions.note_failure(run, failure.epoch, failure.detail.summary)
        self.rows.put(tx, run.id, noted)
        detail = failure.detail
        record = FailureRecord(
            run_id=run.id,
            id=next(self._failure_ids),
            epoch=run.epoch,
            attempt=run.attempt,
            holder=run.holder,
            error_type=detail.error_type,
            message=detail.message,
            failure_class=detail.failure_class,
            traceback=detail.traceback,
            recorded_at=self._clock.now(),
            retry_after=detail.retry_after,
        )
        self._failures.put(tx, run.id, (*self._failures_of(run.id), record))
        return record

    async def continuation_of(self, tx: Transaction, run_id: UUID) -> AgentRun | None:
        self._database.check(tx)
        found = [run for run in self.rows.values() if run.continues == run_id]
        return min(found, key=lambda run: run.seq) if found else None

    async def ids_between(self, tx: Transaction, low: UUID, high: UUID, limit: int) -> list[UUID]:
        self._database.check(tx)
        return sorted(run_id for run_id, _ in self.rows.items() if low <= run_id <= high)[:limit]

    async def failures(self, tx: Transaction, run_id: UUID) -> list[FailureRecord]:
        self._database.check(tx)
        return list(self._failures_of(run_id))

    def all_failures(self) -> list[FailureRecord]:
        """Every failed attempt of every run (the read model's per-minute counts)."""
        return [
            record
            for run_id, records in self._failures.items()
            if self.rows.get(run_id) is not None
            for record in records
        ]

    def _failures_of(self, run_id: UUID) -> tuple[FailureRecord, ...]:
        # A purged run's failures go with it, as ON DELETE CASCADE does in PostgreSQL.
        if self.rows.get(run_id) is None:
            return ()
        return self._failures.get(run_id) or ()

    async def archive(self, tx: Transaction, limit: int) -> int:
        self._database.check(tx)
        moved = heapq.nsmallest(
            limit,
            (
                run
                for run in self.rows.values()
                if run.state is AgentRunState.ENDED and self._archived.get(run.id) is None
            ),
            key=lambda run: run.seq,
        )
        for run in moved:
            self._archived.put(tx, run.id, True)
        return len(moved)

    async def purge(self, tx: Transaction, ended_before: datetime, limit: int) -> int:
        self._database.check(tx)
        doomed = [
            run.id
            for run in self.rows.values()
            if run.state is AgentRunState.ENDED
            and run.ended_at is not None
            and run.ended_at < ended_before
        ][:limit]
        for run_id in doomed:
            run = self.rows.get(run_id)
            assert run is not None
            # A purged run's key goes with it, unless it already names a later run.
            if run.key is not None and self._keys.get((run.workspace, run.key)) == run_id:
                self._keys.delete(tx, (run.workspace, run.key))
            self.rows.delete(tx, run_id)
            if self._archived.get(run_id) is not None:
                self._archived.delete(tx, run_id)
        return len(doomed)

    async def leased_count(self, tx: Transaction, workspace: str) -> int:
        self._database.check(tx)
        return sum(
            1
            for run in self.rows.values()
            if run.workspace == workspace and run.state is AgentRunState.LEASED
        )

    async def watch(self, tx: Transaction, run_id: UUID, watcher: UUID) -> None:
        # The notifier's subscribers are the registry in memory: nothing else to record.
        self._database.check(tx)
        self._existing(run_id)

    async def unwatch(self, tx: Transaction, run_id: UUID, watcher: UUID) -> None:
        self._database.check(tx)


class MemoryEventLog(EventLog):
    """Step events per run; an append checks the fence against the runs table first."""

    def __init__(
        self,
        database: MemoryDatabase,
        clock: Clock,
        runs: MemoryRunStore,
        workspaces: MemoryWorkspaceStore | None = None,
    ) -> None:
        self._database = database
        self._clock = clock
        self._runs = runs
        self._workspaces = workspaces
        self._events: MemoryTable[UUID, tuple[RunEvent, ...]] = MemoryTable(database)
        # The usage ledger (ADRs/0033): one record per step that reported usage, by (run, seq);
        # kept past its run's purge, as agent_usage is.
        self._usage: MemoryTable[tuple[UUID, int], UsageRecord] = MemoryTable(database)

    async def renew_and_append(
        self,
        tx: Transaction,
        fence: AgentRunFence,
        type: str,
        data: JsonObject,
        usage: Usage | None = None,
    ) -> RunEvent:
        run = await self._runs.renew(tx, fence)
        event = self._append_held(tx, fence, type, data)
        if usage is not None:
            self._spent(tx, run, event, usage)
        return event

    def _spent(self, tx: Transaction, run: AgentRun, event: RunEvent, usage: Usage) -> None:
        """The step's usage added to its run's totals and recorded in the ledger."""
        stored = self._runs.rows.get(run.id)
        assert stored is not None  # renewed in this transaction
        self._runs.rows.put(
            tx,
            run.id,
            replace(
                stored,
                input_tokens=stored.input_tokens + (usage.input_tokens or 0),
                output_tokens=stored.output_tokens + (usage.output_tokens or 0),
                cost=stored.cost + (usage.cost or 0),
            ),
        )
        self._usage.put(
            tx,
            (run.id, event.seq),
            UsageRecord(run.id, event.seq, run.workspace, run.kind, event.created_at, usage),
        )
        if self._workspaces is not None:
            workspace = run.workspace

            def ledger() -> list[UsageRecord]:
                return [row for row in self._usage.values() if row.workspace == workspace]

            self._workspaces.charge(tx, workspace, usage, event.created_at, ledger)

    async def window_usage(
        self, tx: Transaction, workspace: str, after: datetime, upto: datetime
    ) -> list[UsageRecord]:
        self._database.check(tx)
        return sorted(
            (
                record
                for record in self._usage.values()
                if record.workspace == workspace and after < record.at <= upto
            ),
            key=lambda record: (record.at, str(record.run_id), record.seq),
        )

    async def spend(
        self, tx: Transaction, workspace: str, since: datetime, until: datetime, per: Per
    ) -> list[Spend]:
        self._database.check(tx)
        records = [record for record in self._usage.values() if record.workspace == workspace]
        return usage_rules.spend(records, since, until, per)

    async def spend_by_workspace(
        self, tx: Transaction, since: datetime, until: datetime
    ) -> list[WorkspaceSpend]:
        self._database.check(tx)
        return usage_rules.spend_by_workspace(list(self._usage.values()), since, until)

    async def renew_and_append_many(
        self, tx: Transaction, steps: Sequence[StepWrite]
    ) -> list[RunEvent | AgentRunsError]:
        results: list[RunEvent | AgentRunsError] = []
        for write in steps:
            try:
                results.append(
                    await self.renew_and_append(
                        tx, write.fence, write.type, write.data, write.usage
                    )
                )
            except (LeaseLost, RunNotFound) as refused:  # refused before anything was written
                results.append(refused)
        return results

    async def append(
        self, tx: Transaction, fence: AgentRunFence, type: str, data: JsonObject
    ) -> RunEvent:
        await self._runs.require_current(tx, fence)
        return self._append_held(tx, fence, type, data)

    def _append_held(
        self, tx: Transaction, fence: AgentRunFence, type: str, data: JsonObject
    ) -> RunEvent:
        existing = self._events_of(fence.run_id)
        event = RunEvent(
            run_id=fence.run_id,
            seq=len(existing) + 1,
            epoch=fence.epoch,
            type=type,
            data=data,
            created_at=self._clock.now(),
        )
        self._events.put(tx, fence.run_id, (*existing, event))
        self._runs.announce(tx, fence.run_id)
        return event

    async def list(
        self, tx: Transaction, run_id: UUID, *, after_seq: int = 0, limit: int | None = None
    ) -> list[RunEvent]:
        self._database.check(tx)
        found = [event for event in self._events_of(run_id) if event.seq > after_seq]
        return found if limit is None else found[:limit]

    def _events_of(self, run_id: UUID) -> tuple[RunEvent, ...]:
        # Events of a purged run go with it, as ON DELETE CASCADE does in PostgreSQL.
        if self._runs.rows.get(run_id) is None:
            return ()
        return self._events.get(run_id) or ()


def _matches(run: AgentRun, query: RunQuery) -> bool:
    return (
        (query.workspace is None or run.workspace == query.workspace)
        and (query.subject is None or run.subject == query.subject)
        and (query.kind is None or run.kind == query.kind)
        and (query.state is None or run.state is query.state)
        and (query.reason is None or run.end_reason is query.reason)
        and (query.band is None or run.band is query.band)
        and (query.enqueued_after is None or run.enqueued_at >= query.enqueued_after)
        and (query.enqueued_before is None or run.enqueued_at < query.enqueued_before)
        and (query.before_seq is None or run.seq < query.before_seq)
        and (not query.waiting or waits.is_waiting(run))
    )
