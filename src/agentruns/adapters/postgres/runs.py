"""The runs table and run events on PostgreSQL: named transitions as guarded statements.

A fenced write that touches no row reads the run once and asks the domain why (the same
transition functions the memory adapter applies), so both adapters raise the same error for the
same conflict: RunNotFound, StaleEpoch, LeaseExpired, RetryBudgetExhausted or IllegalTransition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, NoReturn
from uuid import UUID

from sqlalchemy import TextClause

from agentruns.adapters.postgres import limit_sql, sql
from agentruns.adapters.postgres.database import (
    PostgresDatabase,
    PostgresTransaction,
    Row,
    fetch,
)
from agentruns.app.ports import (
    ClaimRequest,
    EndWrite,
    EventLog,
    NewFailure,
    NewRun,
    RunEvent,
    RunQuery,
    RunStore,
    StepWrite,
    TakeBack,
    Transaction as Tx,
)
from agentruns.domain import run as transitions
from agentruns.domain.bands import Band
from agentruns.domain.errors import (
    AgentRunsError,
    IllegalTransition,
    LeaseLost,
    RunNotFound,
    StaleEpoch,
)
from agentruns.domain.failure_records import FailureRecord, LastFailure
from agentruns.domain.failures import FailureClass
from agentruns.domain.payload import JsonObject, JsonValue
from agentruns.domain.provider_limits import drawn_from, with_room
from agentruns.domain.run import AgentRun, AgentRunFence
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from agentruns.domain.usage import Per, Spend, Usage, UsageRecord, WorkspaceSpend
from agentruns.domain.waits import Delivered, Signal

# Candidates a kinds-restricted claim ranks beyond its limit, so claimers racing for the same
# first heads (each skips the rows another holds locked) still fill their batch.
CLAIM_MARGIN = 8


# The enums by stored value, looked up once per row (an enum's call costs more than the lookup).
_BANDS = {band.value: band for band in Band}
_STATES = {state.value: state for state in AgentRunState}
_REASONS = {reason.value: reason for reason in TerminationReason}
_NO_COST = Decimal(0)


def run_from_row(row: Row) -> AgentRun:
    end_reason = row["end_reason"]
    return AgentRun(
        id=row["id"],
        kind=row["kind"],
        workspace=row["workspace"],
        subject=row["subject"],
        band=_BANDS[row["band"]],
        payload=row["payload"],
        state=_STATES[row["state"]],
        epoch=row["epoch"],
        attempt=row["attempt"],
        seq=row["seq"],
        enqueued_at=row["enqueued_at"],
        due_at=row["due_at"],
        lease=row["lease"],
        deadline_at=row["deadline_at"],
        leased_until=row["leased_until"],
        holder=row["holder"],
        end_reason=None if end_reason is None else _REASONS[end_reason],
        ended_at=row["ended_at"],
        continues=row["continues"],
        domain_row=row["domain_row"],
        trace_context=row["trace_context"],
        last_failure=_last_failure(row),
        # The claim function (ddl/claim.sql) returns its own column list, without it.
        claimed_at=row.get("claimed_at"),
        # Read by the enqueue, get and list statements only: no statement of the worker loop.
        key=row.get("enqueue_key"),
        # Read by get and list only (ADRs/0025): no statement of the worker loop names them.
        waiting_for=row.get("waiting_for"),
        waiting_until=row.get("waiting_until"),
        waiting_since=row.get("waiting_since"),
        # Read by get, list and the holder's end only (ADRs/0026).
        result=row.get("result"),
        # Read by get and list only (ADRs/0033): no statement of the worker loop names them.
        input_tokens=row.get("input_tokens", 0),
        output_tokens=row.get("output_tokens", 0),
        cost=row.get("cost", _NO_COST),
    )


def signal_from_row(row: Row) -> Signal:
    return Signal(
        run_id=row["run_id"],
        name=row["name"],
        signal_id=row["signal_id"],
        payload=row["payload"],
        delivered_at=row["delivered_at"],
        seq=row["id"],
    )


def _last_failure(row: Row) -> LastFailure | None:
    if row["last_error_type"] is None:
        return None
    return LastFailure(
        error_type=row["last_error_type"],
        message=row["last_error"] or "",
        failure_class=FailureClass(row["last_failure_class"]),
    )


def failure_from_row(row: Row) -> FailureRecord:
    return FailureRecord(
        run_id=row["run_id"],
        id=row["id"],
        epoch=row["epoch"],
        attempt=row["attempt"],
        holder=row["holder"],
        error_type=row["error_type"],
        message=row["message"],
        failure_class=FailureClass(row["failure_class"]),
        traceback=row["traceback"],
        recorded_at=row["recorded_at"],
        retry_after=row["retry_after"],
    )


def _kinds(kinds: Sequence[str] | None) -> list[str] | None:
    return None if kinds is None else list(kinds)


def _alone(tx: Tx) -> bool:
    """Whether a claim in ``tx`` is its own transaction, and so takes its turn (ADRs/0038)."""
    return isinstance(tx, PostgresTransaction) and tx.autocommitted


def _claim_key(row: Row) -> tuple[int, int, datetime, int]:
    """The claim order of a claimed row, as the statement ranked it."""
    return (row["claim_band"], row["claim_load"], row["due_at"], row["seq"])


_FAILURE_FIELDS = ("error_type", "message", "failure_class", "traceback")


def _failure(take_back: TakeBack, field: str) -> str | None:
    """One field of the failed attempt a take-back records, as text (``None``: none)."""
    if take_back.failure is None:
        return None
    value = getattr(take_back.failure, field)
    return str(value.value if field == "failure_class" else value)


def _fence_params(fence: AgentRunFence) -> dict[str, Any]:
    return {"run_id": fence.run_id, "workspace": fence.workspace, "epoch": fence.epoch}


def _usage_params(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost": usage.cost,
        "provider": usage.provider,
        "model": usage.model,
    }


def _spent_write(write: StepWrite) -> tuple[object, ...]:
    """A group's step write with its usage (sql.RENEW_AND_APPEND_MANY_USAGE): its type and data,
    then, if it reported usage, its tokens, cost (as text: exact) and names."""
    usage = write.usage
    if usage is None:
        return (write.type, write.data)
    cost = None if usage.cost is None else str(usage.cost)
    return (
        write.type,
        write.data,
        usage.input_tokens,
        usage.output_tokens,
        cost,
        usage.provider,
        usage.model,
    )


def _group_writes(rows: Sequence[tuple[AgentRunFence, Sequence[object]]]) -> str:
    """A group's writes as the one JSON document its statement reads (sql._GROUP)."""
    return json.dumps(
        [[str(fence.run_id), fence.workspace, fence.epoch, *more] for fence, more in rows],
        ensure_ascii=False,
        separators=(",", ":"),
    )


class PostgresRunStore(RunStore):
    def __init__(self, database: PostgresDatabase) -> None:
        self._db = database

    def _params(self, **params: Any) -> dict[str, Any]:
        return {"now": self._db.now_param(), **params}

    async def _one(self, tx: Tx, statement: TextClause, **params: Any) -> AgentRun | None:
        rows = await fetch(tx, statement, self._params(**params))
        return run_from_row(rows[0]) if rows else None

    async def _many(self, tx: Tx, statement: TextClause, **params: Any) -> list[AgentRun]:
        return [run_from_row(row) for row in await fetch(tx, statement, self._params(**params))]

    async def _read(self, tx: Tx, run_id: UUID) -> tuple[AgentRun, datetime]:
        """The run as it stands and the store's now, for saying why a guarded write missed."""
        rows = await fetch(tx, sql.GET_RUN, self._params(run_id=run_id))
        if not rows:
            raise RunNotFound(f"no run {run_id}")
        return run_from_row(rows[0]), rows[0]["now"]

    async def refuse_fenced(self, tx: Tx, fence: AgentRunFence) -> NoReturn:
        """Say why a guarded write under ``fence`` touched no row (one read of the run)."""
        run, now = await self._read(tx, fence.run_id)
        transitions.check_fence(run, fence, now)
        # The fence holds now but did not when the statement ran: a concurrent write won.
        raise StaleEpoch(f"run {fence.run_id} moved under the fence of epoch {fence.epoch}")

    async def now(self, tx: Tx) -> datetime:
        rows = await fetch(tx, sql.NOW_SELECT, self._params())
        now: datetime = rows[0]["now"]
        return now

    def _new_params(self, new: NewRun) -> dict[str, Any]:
        return {
            "id": new.id,
            "kind": new.kind,
            "workspace": new.workspace,
            "subject": new.subject,
            "band": int(new.band),
            "payload": new.payload,
            "epoch": new.epoch,
            "attempt": new.attempt,
            "due_at": new.due_at,
            "lease": new.lease,
            "deadline_at": new.deadline_at,
            "deadline_after": new.deadline_after,
            "continues": new.continues,
            "domain_row": new.domain_row,
            "trace_context": new.trace_context,
            "key": new.key,
        }

    async def insert(self, tx: Tx, new: NewRun) -> AgentRun:
        run = await self._one(tx, sql.INSERT_RUN, **self._new_params(new))
        assert run is not None  # INSERT ... RETURNING returns the row it inserted
        return run

    async def insert_keyed(self, tx: Tx, new: NewRun) -> AgentRun | None:
        return await self._one(tx, sql.INSERT_KEYED, **self._new_params(new))

    async def key_holder(self, tx: Tx, workspace: str, key: str) -> tuple[UUID, datetime] | None:
        rows = await fetch(tx, sql.KEY_HOLDER, self._params(workspace=workspace, key=key))
        return (rows[0]["run_id"], rows[0]["now"]) if rows else None

    async def rekey(self, tx: Tx, new: NewRun) -> AgentRun:
        run = await self._one(tx, sql.REKEY, **self._new_params(new))
        if run is None:
            raise RunNotFound(f"enqueue key {new.key!r} named no run to move from")
        return run

    async def lock_subject(self, tx: Tx, workspace: str, subject: str) -> None:
        await fetch(tx, sql.LOCK_SUBJECT, {"workspace": workspace, "subject": subject})

    async def active_runs(self, tx: Tx, workspace: str, subject: str) -> list[AgentRun]:
        return await self._many(tx, sql.ACTIVE_RUNS, workspace=workspace, subject=subject)

    async def get(self, tx: Tx, run_id: UUID) -> AgentRun | None:
        return await self._one(tx, sql.GET_RUN, run_id=run_id)

    async def lock(self, tx: Tx, run_id: UUID) -> AgentRun | None:
        locked = await self._one(tx, sql.LOCK_RUN, run_id=run_id)
        if locked is not None:
            return locked
        # Not in agent_run: moved to the history (final, so nothing to lock), perhaps by a
        # move that committed while the lock waited; this statement's snapshot sees it.
        return await self._one(tx, sql.MOVED_RUN, run_id=run_id)

    async def list_runs(self, tx: Tx, query: RunQuery) -> list[AgentRun]:
        filters = {
            "workspace": query.workspace,
            "subject": query.subject,
            "kind": query.kind,
            "band": None if query.band is None else int(query.band),
            "reason": None if query.reason is None else query.reason.value,
            "enqueued_after": query.enqueued_after,
            "enqueued_before": query.enqueued_before,
            "before_seq": query.before_seq,
        }
        given = {name: value for name, value in filters.items() if value is not None}
        statement = sql.list_runs(
            [*given, *(["waiting"] if query.waiting else [])],
            None if query.state is None else query.state.value,
            None if query.reason is None else query.reason.value,
        )
        rows = await fetch(tx, statement, {**given, "limit": query.limit})
        return [run_from_row(row) for row in rows]

    async def claim(self, tx: Tx, request: ClaimRequest) -> list[AgentRun]:
        if request.limit <= 0:
            return []
        params = self._params(holder=request.holder, aging=request.band_aging, alone=_alone(tx))
        if request.subject is not None:
            workspace, subject = request.subject
            rows = await fetch(
                tx,
                sql.CLAIM_SUBJECT,
                {
                    **params,
                    "workspace": workspace,
                    "subject": subject,
                    "kinds": None if request.kinds is None else list(request.kinds),
                },
            )
        elif request.kinds is not None:
            kinds = {**params, "kinds": list(request.kinds), "limit": request.limit}
            rows = await fetch(tx, sql.CLAIM_IF_KNOWN, kinds)
            if rows and rows[0]["foreign_kinds"]:
                # Another kind was seen: the lanes cannot serve, the exact kinds claim does.
                pool = request.limit * 4 + CLAIM_MARGIN
                rows = await fetch(tx, sql.CLAIM_KINDS, {**kinds, "pool": pool})
            elif rows and rows[0]["id"] is None:
                rows = []  # the lane claim found nothing: the one row of NULLs
        else:
            rows = await fetch(tx, sql.CLAIM, {**params, "limit": request.limit})
        return [run_from_row(row) for row in sorted(rows, key=_claim_key)]

    async def claim_with_room(
        self, tx: Tx, request: ClaimRequest, limited: Mapping[str, tuple[str, ...]]
    ) -> tuple[list[AgentRun], dict[str, timedelta]]:
        assert request.kinds is not None, "a claim with room names its kinds"
        if request.limit <= 0:
            return [], {}
        params = {
            **self._params(holder=request.holder, aging=request.band_aging, alone=_alone(tx)),
            "kinds": list(request.kinds),
            "limit": request.limit,
        }
        rows = await fetch(tx, limit_sql.CLAIM_IF_ROOM, {**params, "names": drawn_from(limited)})
        first = rows[0]
        empty = {
            name: timedelta(seconds=float(wait))
            for name, wait in zip(first["empty_names"], first["empty_waits"], strict=True)
        }
        if first["foreign_kinds"]:
            # A limit is empty, or another kind was seen: the kinds with room, by CLAIM_KINDS.
            kinds = with_room(request.kinds, limited, empty)
            if not kinds:
                return [], empty
            pool = request.limit * 4 + CLAIM_MARGIN
            rows = await fetch(tx, sql.CLAIM_KINDS, {**params, "kinds": kinds, "pool": pool})
        elif first["id"] is None:
            return [], empty  # the lane claim found nothing: the one row of NULLs
        return [run_from_row(row) for row in sorted(rows, key=_claim_key)], empty

    async def require_current(self, tx: Tx, fence: AgentRunFence) -> AgentRun:
        run = await self._one(tx, sql.REQUIRE_CURRENT, **_fence_params(fence))
        if run is None:
            await self.refuse_fenced(tx, fence)
        return run

    async def renew(self, tx: Tx, fence: AgentRunFence) -> AgentRun:
        run = await self._one(tx, sql.RENEW, **_fence_params(fence))
        if run is None:
            await self.refuse_fenced(tx, fence)
        return run

    async def renew_many(
        self, tx: Tx, fences: Sequence[AgentRunFence]
    ) -> list[AgentRunsError | None]:
        if not fences:
            return []
        writes = _group_writes([(fence, ()) for fence in fences])
        rows = await fetch(tx, sql.RENEW_MANY, {**self._params(), "writes": writes})
        results: list[AgentRunsError | None] = []
        for fence, row in zip(fences, rows, strict=True):
            results.append(None if row["renewed"] else await self.why(tx, fence))
        return results

    async def end(
        self,
        tx: Tx,
        run_id: UUID,
        reason: TerminationReason,
        fence: AgentRunFence | None,
        result: JsonValue = None,
    ) -> AgentRun:
        if fence is not None:
            if fence.run_id != run_id:
                raise StaleEpoch(f"the fence names run {fence.run_id}, not {run_id}")
            run = await self._one(
                tx, sql.END_FENCED, reason=reason.value, result=result, **_fence_params(fence)
            )
            if run is None:
                await self.refuse_fenced(tx, fence)
            return run
        run = await self._one(tx, sql.END_UNFENCED, run_id=run_id, reason=reason.value)
        if run is None:
            current, _ = await self._read(tx, run_id)
            raise IllegalTransition(current.state, AgentRunState.ENDED, f"run {run_id} has ended")
        return run

    async def end_many(
        self, tx: Tx, ends: Sequence[EndWrite], *, ended_runs: bool = True
    ) -> list[AgentRun | AgentRunsError | None]:
        if not ends:
            return []
        fences = [write.fence for write in ends]
        # A write with a result carries it as its fifth element; one without, nothing more.
        writes = _group_writes(
            [
                (w.fence, (w.reason.value,) if w.result is None else (w.reason.value, w.result))
                for w in ends
            ]
        )
        statement = sql.END_MANY if ended_runs else sql.END_MANY_QUIET
        rows = await fetch(tx, statement, {**self._params(), "writes": writes})
        results: list[AgentRun | AgentRunsError | None] = []
        for fence, row in zip(fences, rows, strict=True):
            if row["id"] is None:
                results.append(await self.why(tx, fence))
            else:
                results.append(run_from_row(row) if ended_runs else None)
        return results

    async def why(self, tx: Tx, fence: AgentRunFence) -> AgentRunsError:
        """What a guarded write under ``fence`` that touched no row would have raised."""
        try:
            await self.refuse_fenced(tx, fence)
        except (LeaseLost, RunNotFound) as refused:
            return refused

    async def requeue(
        self,
        tx: Tx,
        fence: AgentRunFence,
        *,
        charged: bool,
        delay: timedelta,
        retry_budget: int,
    ) -> AgentRun:
        run = await self._one(
            tx,
            sql.REQUEUE,
            charge=1 if charged else 0,
            delay=delay,
            retry_budget=retry_budget,
            **_fence_params(fence),
        )
        if run is None:
            current, now = await self._read(tx, fence.run_id)
            # Raises what the domain would: a lost fence, or the retry budget spent.
            transitions.requeue(
                current,
                fence,
                now=now,
                due_at=now + delay,
                charged=charged,
                retry_budget=retry_budget,
            )
            raise StaleEpoch(f"run {fence.run_id} moved under the fence of epoch {fence.epoch}")
        return run

    async def park(
        self,
        tx: Tx,
        fence: AgentRunFence,
        *,
        waiting_for: str | None,
        until: datetime,
        since: datetime,
    ) -> AgentRun:
        run = await self._one(
            tx,
            sql.PARK,
            waiting_for=waiting_for,
            until=until,
            since=since,
            **_fence_params(fence),
        )
        if run is None:
            await self.refuse_fenced(tx, fence)
        return run

    async def postpone(self, tx: Tx, run_id: UUID, due_at: datetime) -> AgentRun:
        run = await self._one(tx, sql.POSTPONE, run_id=run_id, due_at=due_at)
        if run is None:
            current, _ = await self._read(tx, run_id)
            raise IllegalTransition(
                current.state,
                AgentRunState.QUEUED,
                f"run {run_id} is not a queued run never claimed and due before {due_at}",
            )
        return run

    async def clear_wait(self, tx: Tx, fence: AgentRunFence) -> None:
        rows = await fetch(tx, sql.CLEAR_WAIT, self._params(**_fence_params(fence)))
        if not rows:
            await self.refuse_fenced(tx, fence)

    async def wake(self, tx: Tx, run_id: UUID, name: str) -> bool:
        rows = await fetch(tx, sql.WAKE, self._params(run_id=run_id, name=name))
        return bool(rows)

    async def deliver_signal(
        self, tx: Tx, run_id: UUID, name: str, signal_id: str, payload: JsonValue
    ) -> Delivered:
        params = self._params(run_id=run_id, name=name, signal_id=signal_id, payload=payload)
        rows = await fetch(tx, sql.DELIVER_SIGNAL, params)
        if rows:
            return Delivered(signal_from_row(rows[0]), created=True)
        # Delivered before (a concurrent delivery of the id waited for its commit).
        rows = await fetch(tx, sql.SIGNAL_BY_ID, {"run_id": run_id, "signal_id": signal_id})
        return Delivered(signal_from_row(rows[0]), created=False)

    async def signal_of(self, tx: Tx, run_id: UUID, name: str, occurrence: int) -> Signal | None:
        params = {"run_id": run_id, "name": name, "skip": occurrence - 1}
        rows = await fetch(tx, sql.SIGNAL_OF, params)
        return signal_from_row(rows[0]) if rows else None

    async def signals(self, tx: Tx, run_id: UUID) -> list[Signal]:
        rows = await fetch(tx, sql.SIGNALS, {"run_id": run_id})
        return [signal_from_row(row) for row in rows]

    async def expired(
        self, tx: Tx, limit: int, kinds: Sequence[str] | None = None
    ) -> list[AgentRun]:
        return await self._many(tx, sql.EXPIRED, limit=limit, kinds=_kinds(kinds))

    async def expired_kinds(self, tx: Tx, excluding: Sequence[str]) -> dict[str, int]:
        rows = await fetch(tx, sql.EXPIRED_KINDS, self._params(excluding=list(excluding)))
        return {row["kind"]: int(row["leases"]) for row in rows}

    async def take_back(self, tx: Tx, take_back: TakeBack) -> AgentRun | None:
        return await self._one(
            tx,
            sql.TAKE_BACK,
            run_id=take_back.run_id,
            epoch=take_back.epoch,
            retry_budget=take_back.retry_budget,
            delay=take_back.delay,
        )

    async def take_back_many(self, tx: Tx, take_backs: Sequence[TakeBack]) -> list[AgentRun]:
        if not take_backs:
            return []
        batch = [
            [
                str(take_back.run_id),
                take_back.epoch,
                take_back.retry_budget,
                take_back.delay.total_seconds(),
                *(_failure(take_back, field) for field in _FAILURE_FIELDS),
            ]
            for take_back in take_backs
        ]
        return await self._many(
            tx, sql.TAKE_BACK_MANY, take_backs=json.dumps(batch, separators=(",", ":"))
        )

    async def overdue(
        self, tx: Tx, limit: int, kinds: Sequence[str] | None = None
    ) -> list[AgentRun]:
        return await self._many(tx, sql.OVERDUE, limit=limit, kinds=_kinds(kinds))

    async def record_failure(self, tx: Tx, failure: NewFailure) -> FailureRecord:
        detail = failure.detail
        rows = await fetch(
            tx,
            sql.RECORD_FAILURE,
            self._params(
                run_id=failure.run_id,
                epoch=failure.epoch,
                error_type=detail.error_type,
                message=detail.message,
                failure_class=detail.failure_class.value,
                traceback=detail.traceback,
                retry_after=detail.retry_after,
            ),
        )
        if not rows:
            run, _ = await self._read(tx, failure.run_id)
            transitions.note_failure(run, failure.epoch, detail.summary)
            raise StaleEpoch(f"run {failure.run_id} moved under the failure's epoch")
        return failure_from_row(rows[0])

    async def continuation_of(self, tx: Tx, run_id: UUID) -> AgentRun | None:
        return await self._one(tx, sql.CONTINUATION_OF, run_id=run_id)

    async def ids_between(self, tx: Tx, low: UUID, high: UUID, limit: int) -> list[UUID]:
        rows = await fetch(tx, sql.IDS_BETWEEN, {"low": low, "high": high, "limit": limit})
        return [row["id"] for row in rows]

    async def failures(self, tx: Tx, run_id: UUID) -> list[FailureRecord]:
        return [
            failure_from_row(row) for row in await fetch(tx, sql.LIST_FAILURES, {"run_id": run_id})
        ]

    async def purge(self, tx: Tx, ended_before: datetime, limit: int) -> int:
        rows = await fetch(tx, sql.PURGE, {"ended_before": ended_before, "limit": limit})
        return len(rows)

    async def archive(self, tx: Tx, limit: int) -> int:
        rows = await fetch(tx, sql.ARCHIVE, {"limit": limit})
        moved: int = rows[0]["moved"]
        return moved

    async def leased_count(self, tx: Tx, workspace: str) -> int:
        rows = await fetch(tx, sql.LEASED_COUNT, {"workspace": workspace})
        count: int = rows[0]["leased"]
        return count

    async def watch(self, tx: Tx, run_id: UUID, watcher: UUID) -> None:
        if not await fetch(tx, sql.WATCH, {"run_id": run_id, "watcher": watcher}):
            raise RunNotFound(f"no run {run_id}")

    async def unwatch(self, tx: Tx, run_id: UUID, watcher: UUID) -> None:
        await fetch(tx, sql.UNWATCH, {"run_id": run_id, "watcher": watcher})


class PostgresEventLog(EventLog):
    """Step events; an append first holds the fence (``require_current``), so a zombie holder's
    append is refused before anything is written, and appends of one run are serialised."""

    def __init__(self, database: PostgresDatabase, runs: PostgresRunStore) -> None:
        self._db = database
        self._runs = runs

    async def append(self, tx: Tx, fence: AgentRunFence, type: str, data: JsonObject) -> RunEvent:
        await self._runs.require_current(tx, fence)
        return await self._append_held(tx, fence, type, data)

    async def renew_and_append(
        self,
        tx: Tx,
        fence: AgentRunFence,
        type: str,
        data: JsonObject,
        usage: Usage | None = None,
    ) -> RunEvent:
        params = {"now": self._db.now_param(), "type": type, "data": data, **_fence_params(fence)}
        if usage is None:
            rows = await fetch(tx, sql.RENEW_AND_APPEND, params)
        else:
            rows = await fetch(tx, sql.RENEW_AND_APPEND_USAGE, {**params, **_usage_params(usage)})
        if not rows:
            await self._runs.refuse_fenced(tx, fence)
        row = rows[0]
        return RunEvent(
            run_id=fence.run_id,
            seq=row["event_seq"],
            epoch=fence.epoch,
            type=row["event_type"],
            data=row["event_data"],
            created_at=row["event_created_at"],
        )

    async def renew_and_append_many(
        self, tx: Tx, steps: Sequence[StepWrite]
    ) -> list[RunEvent | AgentRunsError]:
        if not steps:
            return []
        if all(w.usage is None for w in steps):
            writes = _group_writes([(w.fence, (w.type, w.data)) for w in steps])
            statement = sql.RENEW_AND_APPEND_MANY
        else:
            writes = _group_writes([(w.fence, _spent_write(w)) for w in steps])
            statement = sql.RENEW_AND_APPEND_MANY_USAGE
        rows = await fetch(tx, statement, {"now": self._db.now_param(), "writes": writes})
        results: list[RunEvent | AgentRunsError] = []
        for write, row in zip(steps, rows, strict=True):
            if not row["renewed"]:
                results.append(await self._runs.why(tx, write.fence))
                continue
            # The event as written: the write's own type and (checked) data, at the sequence
            # number and time the statement gave it.
            results.append(
                RunEvent(
                    run_id=write.fence.run_id,
                    seq=row["seq"],
                    epoch=write.fence.epoch,
                    type=write.type,
                    data=write.data,
                    created_at=row["created_at"],
                )
            )
        return results

    async def spend(
        self, tx: Tx, workspace: str, since: datetime, until: datetime, per: Per
    ) -> list[Spend]:
        params = {"workspace": workspace, "since": since, "until": until, "per": per}
        return [
            Spend(
                period=row["period"],
                kind=row["kind"],
                provider=row["provider"],
                model=row["model"],
                steps=row["steps"],
                input_tokens=int(row["input_tokens"]),
                output_tokens=int(row["output_tokens"]),
                cost=row["cost"],
            )
            for row in await fetch(tx, sql.SPEND, params)
        ]

    async def spend_by_workspace(
        self, tx: Tx, since: datetime, until: datetime
    ) -> list[WorkspaceSpend]:
        params = {"since": since, "until": until}
        return [
            WorkspaceSpend(
                workspace=row["workspace"],
                steps=row["steps"],
                input_tokens=int(row["input_tokens"]),
                output_tokens=int(row["output_tokens"]),
                cost=row["cost"],
            )
            for row in await fetch(tx, sql.SPEND_BY_WORKSPACE, params)
        ]

    async def window_usage(
        self, tx: Tx, workspace: str, after: datetime, upto: datetime
    ) -> list[UsageRecord]:
        params = {"workspace": workspace, "after": after, "upto": upto}
        return [
            UsageRecord(
                row["run_id"],
                row["seq"],
                workspace,
                row["kind"],
                row["at"],
                Usage(
                    input_tokens=row["input_tokens"],
                    output_tokens=row["output_tokens"],
                    cost=row["cost"],
                    provider=row["provider"],
                    model=row["model"],
                ),
            )
            for row in await fetch(tx, sql.WINDOW_USAGE, params)
        ]

    async def _append_held(
        self, tx: Tx, fence: AgentRunFence, type: str, data: JsonObject
    ) -> RunEvent:
        """Append under a fence this transaction already holds (the run's row is locked)."""
        rows = await fetch(
            tx,
            sql.APPEND_EVENT,
            {
                "now": self._db.now_param(),
                "run_id": fence.run_id,
                "epoch": fence.epoch,
                "type": type,
                "data": data,
            },
        )
        return _event(rows[0])

    async def list(
        self, tx: Tx, run_id: UUID, *, after_seq: int = 0, limit: int | None = None
    ) -> list[RunEvent]:
        params = {"run_id": run_id, "after_seq": after_seq, "limit": limit}
        return [_event(row) for row in await fetch(tx, sql.LIST_EVENTS, params)]


def _event(row: Row) -> RunEvent:
    return RunEvent(
        run_id=row["run_id"],
        seq=row["seq"],
        epoch=row["epoch"],
        type=row["type"],
        data=row["data"],
        created_at=row["created_at"],
    )
