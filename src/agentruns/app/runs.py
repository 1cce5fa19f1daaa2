"""``AgentRuns``: the only writer of runs.

Every method validates its input before it opens a transaction (the limits are in
:mod:`agentruns.domain.limits`), so a refused request raises
:class:`~agentruns.domain.errors.InvalidRequest` on every adapter and writes nothing. Methods that
a holder calls inside its own transaction take ``tx``; without one they open and commit their
own. Lock order everywhere: the kind's domain row, then its run.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TypeVar
from uuid import UUID

from agentruns.app.kinds import AgentRunHandler, NoDomainRow, RunKind, RunKinds
from agentruns.app.metrics import Metrics, NoMetrics
from agentruns.app.ports import (
    BudgetHold,
    ClaimRequest,
    EndWrite,
    NewFailure,
    NewRun,
    RenewWrite,
    RunEvent,
    RunQuery,
    StepWrite,
    Stores,
    Transaction,
)
from agentruns.app.tracing import NoTracing, Tracing
from agentruns.app.watch import RunUpdate, RunWatcher
from agentruns.domain import keys, limits, subject_policy, usage as usage_rules
from agentruns.domain.backoff import RandomSource
from agentruns.domain.bands import DEFAULT_BAND_AGING, Band
from agentruns.domain.budgets import (
    Budget,
    BudgetState,
    BudgetView,
    period_bounds,
    rolling_hold_until,
    window_state,
)
from agentruns.domain.errors import (
    AgentRunsError,
    IllegalTransition,
    InvalidRequest,
    LimitExhausted,
    RunAlreadyEnded,
    RunNotFound,
    TransactionConflict,
    UnknownKind,
)
from agentruns.domain.failure_records import FailureRecord
from agentruns.domain.payload import JsonObject, validate_payload, validate_result
from agentruns.domain.provider_limits import ProviderLimit, check_take, drawn_from, with_room
from agentruns.domain.recorded_steps import RECORDED_STEP, step_record
from agentruns.domain.run import AgentRun, AgentRunFence, continue_after, retry_after_end
from agentruns.domain.states import AgentRunState
from agentruns.domain.subject_policy import OnActive
from agentruns.domain.termination import TerminationReason
from agentruns.domain.usage import Spend, Usage, WorkspaceSpend
from agentruns.domain.waits import (
    SLEEP_STEP,
    SLEPT,
    TIMED_OUT,
    Delivered,
    Signal,
    same_wait,
    signalled,
    wait_step,
)

# A budget hold makes the claim roll back and try again without the held workspaces; a few
# rounds are plenty, since each round holds at least one more workspace.
_MAX_CLAIM_ROUNDS = 8
_CONFLICT_RETRIES = 3
MAX_PAGE = 1000
_E = TypeVar("_E", AgentRunState, TerminationReason)
_CURSOR_PREFIX = "r"
# The state filter of list_runs that names the waiting runs, a kind of queued run (ADRs/0025).
WAITING = "waiting"


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of :meth:`AgentRuns.list_runs`: runs newest first, and the cursor of the next
    page (``None`` on the last one). The cursor is opaque: pass it back as ``cursor=``."""

    runs: list[AgentRun]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What :meth:`AgentRuns.enqueue_once` did: the run its key names, and whether this enqueue
    made it (``created``) or found it already enqueued (``created`` is False: nothing was
    written)."""

    run: AgentRun
    created: bool


@dataclass(frozen=True, slots=True)
class _Merge:
    """A merge's debounce window (``None``: none) and its longest wait from the enqueue."""

    debounce: timedelta | None
    max_wait: timedelta | None


class _BudgetHeld(Exception):
    def __init__(self, holds: list[BudgetHold]) -> None:
        super().__init__("budget held")
        self.holds = holds


_name = limits.name


def _fence(fence: object) -> AgentRunFence:
    """A fence a host handed in: a run id, a workspace name and an epoch PostgreSQL can hold."""
    if not isinstance(fence, AgentRunFence):
        raise InvalidRequest(f"a fence is an AgentRunFence, not {type(fence).__name__}")
    limits.run_id(fence.run_id)
    _name(fence.workspace, "the fence's workspace")
    limits.epoch(fence.epoch, "the fence's epoch")
    return fence


def _budget_hold(hold: object) -> BudgetHold:
    if not isinstance(hold, BudgetHold):
        raise InvalidRequest(f"a budget hold is a BudgetHold, not {type(hold).__name__}")
    _name(hold.workspace, "workspace")
    limits.moment(hold.until, "until")
    if not isinstance(hold.reason, str) or len(hold.reason) > limits.MAX_NAME_LENGTH:
        raise InvalidRequest(
            f"a hold's reason is text of at most {limits.MAX_NAME_LENGTH} characters"
        )
    limits.check_text(hold.reason, "the hold's reason")
    # A host's hold is its own, never a budget's (which only the budget lifts): ADRs/0033.
    return replace(hold, by_budget=False) if hold.by_budget else hold


class AgentRuns:
    def __init__(
        self,
        stores: Stores,
        kinds: RunKinds,
        rng: RandomSource,
        *,
        band_aging: timedelta = DEFAULT_BAND_AGING,
        new_id: Callable[[], UUID] = uuid.uuid4,
        tracing: Tracing | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._stores = stores
        self._kinds = kinds
        # What the use cases themselves count (signals delivered); the worker counts the rest.
        self._metrics = metrics or NoMetrics()
        self._rng = rng
        self._band_aging = band_aging
        self._new_id = new_id
        self._tracing = tracing or NoTracing()
        self._watcher = RunWatcher(stores)

    @property
    def kinds(self) -> RunKinds:
        return self._kinds

    @property
    def stores(self) -> Stores:
        return self._stores

    @asynccontextmanager
    async def transaction(self, tx: Transaction | None = None) -> AsyncIterator[Transaction]:
        """The caller's transaction if it gave one, else a new one committed on exit."""
        if tx is not None:
            yield tx
            return
        async with self._stores.scope.transaction() as own:
            yield own

    async def enqueue(
        self,
        kind: str,
        *,
        workspace: str,
        subject: str,
        band: Band | str | int = Band.BATCH,
        payload: object = None,
        due_at: datetime | None = None,
        deadline_at: datetime | None = None,
        key: str | None = None,
        on_active: OnActive | str | None = None,
        debounce: timedelta | None = None,
        tx: Transaction | None = None,
    ) -> AgentRun:
        """Queue a run. An unknown kind, a bad band, a name, payload or time outside the limits
        of :mod:`agentruns.domain.limits`, or a deadline not after the due time is refused
        (:class:`~agentruns.domain.errors.InvalidRequest`) before anything is written.

        With a ``key``, enqueue at most once: if the key still names a run in ``workspace``
        (one not ended, or ended within its kind's ``key_retention``), that run is returned and
        nothing is written; a run of another kind, subject or payload is a
        :class:`~agentruns.domain.errors.KeyConflict` (:mod:`agentruns.domain.keys`). Whether
        the run is new is :meth:`enqueue_once`'s ``created``; the run carries its ``key``.

        ``on_active`` (else the kind's ``RunKindPolicy.on_active``) says what happens when the
        subject has a run that has not ended (:mod:`agentruns.domain.subject_policy`,
        ADRs/0028): ``queue`` behind it; ``reject`` (:class:`~agentruns.domain.errors.SubjectBusy`
        names it, nothing is written); ``interrupt`` (each such run is ended cancelled, its
        holder told, and the new run is the subject's next, in one transaction); ``merge`` (if
        the subject's newest active run was never claimed, the new work joins it: that run is
        returned, its payload unchanged, and the kind reads every input with :meth:`inputs`;
        else the run is queued as ``queue`` does). ``debounce`` (else the kind's
        ``RunKindPolicy.debounce``; merge only) keeps a run that a merge made or joined from
        being claimed until that long after the last work arrived, and no later than the
        kind's ``debounce_max_wait`` after its enqueue (ADRs/0031). A key is looked up first: a
        held key returns its run whatever the policy; a key with ``merge`` is refused.

        With tracing on, the enqueue is a span in the caller's trace, and the run keeps that
        span's context: each attempt's spans link to it (ADRs/0014)."""
        done = await self._enqueue(
            kind,
            workspace,
            subject,
            band,
            payload,
            due_at,
            deadline_at,
            key,
            on_active,
            debounce,
            tx,
        )
        return done.run

    async def enqueue_once(
        self,
        kind: str,
        *,
        workspace: str,
        subject: str,
        key: str | None,
        band: Band | str | int = Band.BATCH,
        payload: object = None,
        due_at: datetime | None = None,
        deadline_at: datetime | None = None,
        on_active: OnActive | str | None = None,
        debounce: timedelta | None = None,
        tx: Transaction | None = None,
    ) -> Enqueued:
        """:meth:`enqueue` with a key, or under ``merge``, saying whether a run was made:
        ``Enqueued(run, created)``; ``created`` is False when the key named a run already, or
        when the work joined a queued run (ADRs/0031). Two enqueues racing with one key make one
        run and both get it. ``key=None`` is taken only under ``merge`` (the argument or the
        kind's policy)."""
        if key is None:
            registered = self._kinds.get(kind)
            merging = (
                registered.policy.on_active if on_active is None else OnActive.parse(on_active)
            )
            if merging is not OnActive.MERGE:
                raise InvalidRequest("enqueue_once needs a key (or on_active merge)")
        return await self._enqueue(
            kind,
            workspace,
            subject,
            band,
            payload,
            due_at,
            deadline_at,
            key,
            on_active,
            debounce,
            tx,
        )

    async def _enqueue(
        self,
        kind: str,
        workspace: str,
        subject: str,
        band: Band | str | int,
        payload: object,
        due_at: datetime | None,
        deadline_at: datetime | None,
        key: str | None,
        on_active: OnActive | str | None,
        debounce: timedelta | None,
        tx: Transaction | None,
    ) -> Enqueued:
        registered = self._kinds.get(kind)
        policy = registered.policy.on_active if on_active is None else OnActive.parse(on_active)
        window = subject_policy.debounce_window(debounce)
        if window is not None and policy is not OnActive.MERGE:
            raise InvalidRequest(f"a debounce is a merge's: on_active is {policy}, not merge")
        if policy is OnActive.MERGE and key is not None:
            raise InvalidRequest(
                "an enqueue key and on_active merge are not taken together: a key names one "
                "run's work, and a merge's work joins another run (ADRs/0031)"
            )
        merge = (
            None
            if policy is not OnActive.MERGE
            else _Merge(
                window if window is not None else registered.policy.debounce,
                registered.policy.debounce_max_wait,
            )
        )
        due = limits.optional_moment(due_at, "due_at")
        deadline = limits.optional_moment(deadline_at, "deadline_at")
        limits.deadline_after_due(due, deadline)
        new = NewRun(
            id=self._new_id(),
            kind=registered.name,
            workspace=_name(workspace, "workspace"),
            subject=_name(subject, "subject"),
            band=Band.parse(band),
            payload=validate_payload({} if payload is None else payload),
            lease=registered.policy.lease,
            due_at=due,
            deadline_at=deadline,
            deadline_after=registered.policy.deadline,
            domain_row=registered.handler.has_domain_row,
            key=None if key is None else keys.key(key),
        )
        with self._tracing.enqueue(new.kind, new.workspace, new.subject, new.id) as carrier:
            if carrier:
                new = replace(new, trace_context=carrier)
            kept_for = registered.policy.key_retention
            if policy is not OnActive.QUEUE:
                return await self._on_active(new, policy, kept_for, registered.handler, tx, merge)
            async with self.transaction(tx) as inner:
                if new.key is None:
                    done = Enqueued(await self._stores.runs.insert(inner, new), created=True)
                else:
                    done = await self._keyed(inner, new, kept_for)
                if done.created:
                    await registered.handler.on_moved(inner, done.run)
        return done

    async def _on_active(
        self,
        new: NewRun,
        policy: OnActive,
        kept_for: timedelta,
        handler: AgentRunHandler,
        tx: Transaction | None,
        merge: _Merge | None = None,
    ) -> Enqueued:
        """An enqueue under ``reject``, ``interrupt`` or ``merge``, in one transaction (ADRs/0028,
        0031); one that PostgreSQL aborted as a deadlock runs again if the transaction is its
        own."""
        for attempt in range(_CONFLICT_RETRIES):
            try:
                async with self.transaction(tx) as inner:
                    done = await self._apply_policy(inner, new, policy, kept_for, merge)
                    if done.created:
                        await handler.on_moved(inner, done.run)
                    return done
            except TransactionConflict:
                if tx is not None or attempt + 1 == _CONFLICT_RETRIES:
                    raise
        raise AssertionError("unreachable")

    async def _apply_policy(
        self,
        tx: Transaction,
        new: NewRun,
        policy: OnActive,
        kept_for: timedelta,
        merge: _Merge | None = None,
    ) -> Enqueued:
        """Hold the subject, look the key up, then let the domain decide on the subject's
        active runs: reject, end them cancelled before the insert, or join the newest.

        Lock order for an interrupt and a merge: each run it will write (its domain row, then
        the run), and only then the subject, the lock an ending run's trigger takes after its
        row: a holder ending its run at that moment is waited for, not deadlocked. A run that
        appeared between the two reads is locked after the subject (rarely; a deadlock there
        runs the enqueue again). A merge decides on a read made after its run's lock: a claim
        that committed first shows the run leased (the work is queued as a new run), and a
        claim after it skips the locked run until the merge committed."""
        runs = self._stores.runs
        locked: set[UUID] = set()
        if policy is not OnActive.REJECT:
            first = await runs.active_runs(tx, new.workspace, new.subject)
            if policy is OnActive.INTERRUPT:
                await self._lock_runs(tx, first, locked)
            else:
                early = subject_policy.decide(policy, first, kind=new.kind)
                if isinstance(early, subject_policy.Join):
                    await self._lock_runs(tx, [early.into], locked)
        await runs.lock_subject(tx, new.workspace, new.subject)
        if new.key is not None:
            found = await self._held_key(tx, new, kept_for)
            if found is not None:
                return found
        while True:
            decision = subject_policy.decide(
                policy, await runs.active_runs(tx, new.workspace, new.subject), kind=new.kind
            )
            if not isinstance(decision, subject_policy.Join) or decision.into.id in locked:
                break
            await self._lock_runs(tx, [decision.into], locked)  # then read again
        if isinstance(decision, subject_policy.Join):
            assert merge is not None
            return Enqueued(await self._join(tx, decision.into, new, merge), created=False)
        if merge is not None and merge.debounce is not None:
            new = await self._debounced(tx, new, merge)
        await self._lock_runs(tx, decision.interrupt, locked)
        for run in decision.interrupt:
            ended = await runs.end(tx, run.id, TerminationReason.CANCELLED, None)
            await self.handler_of(run).on_moved(tx, ended)
        if new.key is None:
            return Enqueued(await runs.insert(tx, new), created=True)
        return await self._keyed(tx, new, kept_for)

    async def _join(self, tx: Transaction, into: AgentRun, new: NewRun, merge: _Merge) -> AgentRun:
        """``new``'s work joins ``into`` (locked, and read after its lock: never claimed): one
        more merged input, and with a debounce a later due time."""
        runs = self._stores.runs
        subject_policy.check_merged(into, await runs.signals(tx, into.id), new.payload)
        await runs.deliver_signal(tx, into.id, subject_policy.MERGED, str(new.id), new.payload)
        if merge.debounce is not None:
            now = await runs.now(tx)
            due = subject_policy.debounced_due(
                into.due_at, into.enqueued_at, now, merge.debounce, merge.max_wait
            )
            if due != into.due_at:
                await runs.postpone(tx, into.id, due)
        joined = await runs.get(tx, into.id)
        assert joined is not None  # locked by this transaction
        return joined

    async def _debounced(self, tx: Transaction, new: NewRun, merge: _Merge) -> NewRun:
        """``new`` due no sooner than its debounce after now (it is a merge's first work)."""
        assert merge.debounce is not None
        now = await self._stores.runs.now(tx)
        due = subject_policy.debounced_due(
            new.due_at or now, now, now, merge.debounce, merge.max_wait
        )
        if new.deadline_at is not None:
            limits.deadline_after_due(due, new.deadline_at)
        return replace(new, due_at=due)

    async def _lock_runs(
        self, tx: Transaction, found: Sequence[AgentRun], locked: set[UUID]
    ) -> None:
        """Lock each run of ``found`` not locked yet: its domain row, then the run."""
        for run in found:
            if run.id in locked:
                continue
            await self.handler_of(run).lock_domain_row(tx, run)
            await self._stores.runs.lock(tx, run.id)
            locked.add(run.id)

    async def _held_key(self, tx: Transaction, new: NewRun, kept_for: timedelta) -> Enqueued | None:
        """The run ``new.key`` still names (nothing is written), or ``None``."""
        assert new.key is not None
        holder = await self._stores.runs.key_holder(tx, new.workspace, new.key)
        return None if holder is None else await self._named(tx, new, holder, kept_for)

    async def _named(
        self, tx: Transaction, new: NewRun, holder: tuple[UUID, datetime], kept_for: timedelta
    ) -> Enqueued | None:
        """The run a key's ``holder`` row names, if the key still holds it (the same kind,
        subject and payload, or KeyConflict); ``None`` past its retention or purged."""
        assert new.key is not None
        run_id, now = holder
        existing = await self._stores.runs.get(tx, run_id)
        if not keys.held(existing, now, kept_for):
            return None
        assert existing is not None
        same = keys.check_same(
            existing, name=new.key, kind=new.kind, subject=new.subject, payload=new.payload
        )
        return Enqueued(same, created=False)

    async def _keyed(self, tx: Transaction, new: NewRun, kept_for: timedelta) -> Enqueued:
        """Insert ``new`` under its key, or find the run the key still names (nothing written).
        A key whose run was purged between the two reads is taken again."""
        assert new.key is not None
        runs = self._stores.runs
        for _ in range(_CONFLICT_RETRIES):
            inserted = await runs.insert_keyed(tx, new)
            if inserted is not None:
                return Enqueued(inserted, created=True)
            holder = await runs.key_holder(tx, new.workspace, new.key)
            if holder is None:
                continue  # the key went (purged with its run) after the insert saw it
            found = await self._named(tx, new, holder, kept_for)
            if found is not None:
                return found
            return Enqueued(await runs.rekey(tx, new), created=True)
        raise TransactionConflict(f"enqueue key {limits.shown(new.key)} kept moving: try again")

    async def claim(
        self, holder: str, *, limit: int = 1, kinds: Sequence[str] | None = None
    ) -> list[AgentRun]:
        """Lease up to ``limit`` due runs (one per subject) in the claim order, for a worker."""
        request = self._claim_request(holder, limit, kinds)
        return await self._claim(request, None)

    def _claim_request(
        self, holder: str, limit: object, kinds: Sequence[str] | None
    ) -> ClaimRequest:
        """A worker's claim request, checked: its holder's name, an integer limit, known kinds."""
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise InvalidRequest(f"a claim's limit is an integer, not {limits.shown(limit)}")
        return ClaimRequest(
            holder=_name(holder, "holder"),
            limit=limit,
            kinds=self._known(kinds),
            band_aging=self._band_aging,
        )

    async def claim_with_room(
        self,
        holder: str,
        *,
        limit: int,
        kinds: Sequence[str],
        limited: Mapping[str, tuple[str, ...]],
    ) -> tuple[list[AgentRun], dict[str, timedelta]]:
        """As :meth:`claim` of ``kinds``, leasing no run of a kind whose provider limits
        (``limited``: kind -> the limit names it draws from) could not grant one request and one
        token now, so an empty or paused limit spends no attempt (ADRs/0032); with those empty
        limits and how long until each could grant (a worker idles no longer)."""
        request = self._claim_request(holder, limit, kinds)
        if request.limit < 1 or not request.kinds:
            return [], {}
        if self._kinds.plain:
            # The limits' read and the claim in one statement (the claim is the whole use case).
            async with self._stores.scope.statement() as alone:
                return await self._stores.runs.claim_with_room(alone, request, limited)
        empty = await self.empty_limits(drawn_from(limited))
        room = with_room(request.kinds, limited, empty)
        return await self._claim(replace(request, kinds=room), None), empty

    async def claim_subject(
        self,
        holder: str,
        workspace: str,
        subject: str,
        *,
        kinds: Sequence[str],
        tx: Transaction | None = None,
    ) -> AgentRun | None:
        """Lease the next due run of the given kinds on ``subject`` of ``workspace`` (for a
        sandbox), or ``None``. Another workspace's runs on the same subject string are never
        offered: a subject is named within its workspace."""
        request = ClaimRequest(
            holder=_name(holder, "holder"),
            limit=1,
            kinds=self._known(kinds),
            subject=(_name(workspace, "workspace"), _name(subject, "subject")),
            band_aging=self._band_aging,
        )
        claimed = await self._claim(request, tx)
        return claimed[0] if claimed else None

    async def _claim(self, request: ClaimRequest, tx: Transaction | None) -> list[AgentRun]:
        if request.limit < 1 or (request.kinds is not None and not request.kinds):
            return []
        if tx is None and self._kinds.plain:
            # No handler checks a budget or moves a row: the claim statement is the whole use
            # case, committed on its own (ADRs/0017).
            async with self._stores.scope.statement() as alone:
                return await self._stores.runs.claim(alone, request)
        for _ in range(_MAX_CLAIM_ROUNDS):
            try:
                if tx is None:
                    async with self._stores.scope.transaction() as own:
                        return await self._claim_once(request, own)
                async with self._stores.scope.savepoint(tx):
                    return await self._claim_once(request, tx)
            except _BudgetHeld as held:
                # The claim rolled back: no epoch or attempt spent. Record the holds so the
                # next round no longer offers the held workspaces' runs.
                await self._hold(held.holds, tx)
        return []

    async def _claim_once(self, request: ClaimRequest, inner: Transaction) -> list[AgentRun]:
        claimed = await self._stores.runs.claim(inner, request)
        holds: list[BudgetHold] = []
        for run in claimed:
            hold = await self._kinds.get(run.kind).handler.check_budget(inner, run)
            if hold is not None:
                holds.append(hold)
        if holds:
            raise _BudgetHeld(holds)
        for run in claimed:
            await self._kinds.get(run.kind).handler.on_moved(inner, run)
        return claimed

    async def _hold(self, holds: list[BudgetHold], tx: Transaction | None) -> None:
        async with self.transaction(tx) as inner:
            for hold in holds:
                await self._stores.workspaces.hold_budget(inner, hold)

    async def require_current(self, tx: Transaction, fence: AgentRunFence) -> AgentRun:
        """Check the fence and hold the lease until ``tx`` ends: a stale epoch and an expired
        lease (whatever its epoch) raise :class:`~agentruns.domain.errors.LeaseLost`."""
        return await self._stores.runs.require_current(tx, _fence(fence))

    async def renew(self, fence: AgentRunFence, *, tx: Transaction | None = None) -> AgentRun:
        """The heartbeat: push the lease to now + the run's lease length, if the fence holds."""
        _fence(fence)
        async with self.transaction(tx) as inner:
            return await self._stores.runs.renew(inner, fence)

    async def append_event(
        self, fence: AgentRunFence, type: str, data: object = None, *, tx: Transaction | None = None
    ) -> RunEvent:
        """Persist a step event under the fence; a zombie holder appends nothing."""
        _fence(fence)
        checked = validate_payload({} if data is None else data)
        async with self.transaction(tx) as inner:
            return await self._stores.events.append(inner, fence, _name(type, "type"), checked)

    async def step_boundary(
        self,
        fence: AgentRunFence,
        type: str,
        data: object = None,
        *,
        tx: Transaction | None = None,
        usage: Usage | None = None,
    ) -> RunEvent:
        """Renew the lease and persist the step's event, as one store operation: the event is
        appended only if the renewal held, so a zombie holder appends nothing. With ``usage``,
        what the step spent is added to the run's totals and recorded in the usage ledger in
        that same fenced write (ADRs/0033): a zombie holder records none of it."""
        _fence(fence)
        checked = validate_payload({} if data is None else data)
        spent = usage_rules.usage(usage)
        async with self.transaction(tx) as inner:
            if spent is None:
                return await self._stores.events.renew_and_append(
                    inner, fence, _name(type, "type"), checked
                )
            return await self._stores.events.renew_and_append(
                inner, fence, _name(type, "type"), checked, spent
            )

    async def spend_by_workspace(
        self, since: datetime, until: datetime, *, tx: Transaction | None = None
    ) -> list[WorkspaceSpend]:
        """Every workspace's spend at ``since <= at < until``, most cost first (ADRs/0033)."""
        start = limits.moment(since, "since")
        end = limits.moment(until, "until")
        if end < start:
            raise InvalidRequest(f"until ({end}) is before since ({start})")
        async with self.transaction(tx) as inner:
            return await self._stores.events.spend_by_workspace(inner, start, end)

    async def spend(
        self,
        workspace: str,
        since: datetime,
        until: datetime,
        per: str = "day",
        *,
        tx: Transaction | None = None,
    ) -> list[Spend]:
        """A workspace's spend at ``since <= at < until``: the usage its steps reported, per UTC
        ``per`` (``"hour"``, ``"day"`` or ``"month"``), kind, provider and model, in that order
        (ADRs/0033). The usage of purged runs is counted: the ledger outlives them."""
        checked_per = usage_rules.per(per)
        start = limits.moment(since, "since")
        end = limits.moment(until, "until")
        if end < start:
            raise InvalidRequest(f"until ({end}) is before since ({start})")
        async with self.transaction(tx) as inner:
            return await self._stores.events.spend(
                inner, _name(workspace, "workspace"), start, end, checked_per
            )

    async def settle_group(
        self, writes: Sequence[StepWrite | EndWrite | RenewWrite], *, ended_runs: bool = True
    ) -> list[RunEvent | AgentRun | AgentRunsError | None]:
        """Step boundaries, heartbeats and ends of several held runs, set-based and committed
        together, each under its own fence; one result per write, in order: what
        :meth:`step_boundary` or :meth:`end` would have returned (``None`` for a heartbeat that
        held), or the error it, or :meth:`renew`, would have raised (a failed fence writes
        nothing for its run and neither blocks nor rolls back the others). Without
        ``ended_runs``, an end that held answers ``None``: its run is not read back.

        Only for kinds without a domain row: an end here calls no handler hook. The writes
        name distinct runs."""
        named = [write.fence.run_id for write in writes]
        if len(set(named)) != len(named):
            raise InvalidRequest("a group of writes names one run twice")
        results: dict[int, RunEvent | AgentRun | AgentRunsError | None] = {}
        steps: list[tuple[int, StepWrite]] = []
        ends: list[tuple[int, EndWrite]] = []
        renewals: list[tuple[int, AgentRunFence]] = []
        for index, write in enumerate(writes):
            try:
                _fence(write.fence)
                if isinstance(write, EndWrite):
                    ends.append(
                        (
                            index,
                            EndWrite(
                                write.fence, _reason(write.reason), validate_result(write.result)
                            ),
                        )
                    )
                    continue
                if isinstance(write, RenewWrite):
                    renewals.append((index, write.fence))
                    continue
                checked = StepWrite(
                    write.fence,
                    _name(write.type, "type"),
                    validate_payload(write.data),
                    usage_rules.usage(write.usage),
                )
            except InvalidRequest as refused:
                results[index] = refused
            else:
                steps.append((index, checked))
        # One kind of write alone is one statement (and reads only for refused fences): no
        # BEGIN, no COMMIT. More than one kind are a statement each, in one transaction.
        kinds_of_write = bool(steps) + bool(ends) + bool(renewals)
        scope = (
            self._stores.scope.transaction()
            if kinds_of_write > 1
            else self._stores.scope.statement()
        )
        async with scope as inner:
            if renewals:
                renewed = await self._stores.runs.renew_many(
                    inner, [fence for _, fence in renewals]
                )
                results.update(zip((index for index, _ in renewals), renewed, strict=True))
            if steps:
                stepped = await self._stores.events.renew_and_append_many(
                    inner, [write for _, write in steps]
                )
                results.update(zip((index for index, _ in steps), stepped, strict=True))
            if ends:
                ended = await self._stores.runs.end_many(
                    inner, [write for _, write in ends], ended_runs=ended_runs
                )
                results.update(zip((index for index, _ in ends), ended, strict=True))
        return [results[index] for index in range(len(writes))]

    async def end(
        self,
        fence: AgentRunFence,
        reason: TerminationReason,
        *,
        tx: Transaction | None = None,
        failure: NewFailure | None = None,
        result: object = None,
    ) -> AgentRun:
        """The holder settles its run with ``reason``; with ``failure``, the failed attempt is
        recorded on the run in the same transaction (and not at all if the fence fails); with
        ``result`` (any JSON value within the payload limits), the run ends with it, in the
        same fenced write (ADRs/0026): a refused fence writes neither."""
        _fence(fence)
        reason = _reason(reason)
        checked = validate_result(result)
        async with self.transaction(tx) as inner:
            if not self._kinds.any_domain_rows:
                # No kind has a domain row to lock first: settle without reading the run. A run
                # of a kind this process does not know raises UnknownKind, as the read would
                # have, and its transaction rolls back.
                await self._record(inner, fence, failure)
                run = await self._stores.runs.end(inner, fence.run_id, reason, fence, checked)
                self._kinds.get(run.kind)
                return run
            kind = await self._lock_domain_row(inner, fence.run_id)
            await self._record(inner, fence, failure)
            run = await self._stores.runs.end(inner, fence.run_id, reason, fence, checked)
            await kind.handler.on_moved(inner, run)
            return run

    async def _record(
        self, tx: Transaction, fence: AgentRunFence, failure: NewFailure | None
    ) -> None:
        """Record a failed attempt before the fenced write that settles it: the record needs the
        run still leased, and a refused fence rolls both back."""
        if failure is None:
            return
        if (failure.run_id, failure.epoch) != (fence.run_id, fence.epoch):
            raise InvalidRequest("a failure is recorded under the fence of its own attempt")
        await self._stores.runs.record_failure(tx, failure)

    async def requeue(
        self,
        fence: AgentRunFence,
        *,
        charged: bool,
        delay: timedelta | None = None,
        tx: Transaction | None = None,
        failure: NewFailure | None = None,
    ) -> AgentRun:
        """Give the run back to the queue. A charged requeue spends an attempt; without a
        ``delay`` it waits the kind's backoff for the attempt it starts (a given delay is at
        most :data:`~agentruns.domain.limits.MAX_DELAY`). With ``failure``, the failed attempt
        is recorded on the run in the same transaction.

        An uncharged requeue with its ``delay`` needs no policy, so a holder may give back a
        run of a kind this process does not know (a worker that leased what it cannot run), as
        :meth:`cancel` may end one: if the kind kept no domain row when the run was enqueued,
        else UnknownKind, since only its handler can move that row."""
        _fence(fence)
        if delay is not None:
            limits.duration(delay, "delay", longest=limits.MAX_DELAY, zero=True)
        async with self.transaction(tx) as inner:
            found = await self._stores.runs.get(inner, fence.run_id)
            if found is None:
                raise RunNotFound(f"no run {fence.run_id}")
            if not charged and delay is not None and found.kind not in self._kinds:
                # No policy needed: the attempt stays, and the delay is given.
                handler, budget = self.handler_of(found), found.attempt
                await handler.lock_domain_row(inner, found)
                await self._record(inner, fence, failure)
            else:
                kind = self._kinds.get(found.kind)
                handler, budget = kind.handler, kind.policy.retry_budget
                await handler.lock_domain_row(inner, found)
                await self._record(inner, fence, failure)
                if delay is None:
                    current = await self._stores.runs.require_current(inner, fence)
                    next_attempt = current.attempt + 1 if charged else current.attempt
                    delay = kind.policy.backoff.delay(next_attempt, self._rng)
            run = await self._stores.runs.requeue(
                inner, fence, charged=charged, delay=delay, retry_budget=budget
            )
            await handler.on_moved(inner, run)
            return run

    async def signal(
        self,
        run_id: UUID,
        name: str,
        payload: object = None,
        *,
        signal_id: str | None = None,
    ) -> Delivered:
        """Deliver the signal ``name`` with its JSON ``payload`` to the run (ADRs/0025): kept
        for the run's wait for that name (the k-th wait for a name takes the k-th signal of
        it), and a run waiting for it now is due at once (idle claimers are woken on commit).

        Delivered once per ``signal_id``: a delivery whose id the run has seen writes nothing
        and answers the first delivery's signal (``created`` False), even after the run ended.
        Without an id, each delivery is a signal of its own (an id is made for it). An ended run
        takes no new signal (:class:`~agentruns.domain.errors.RunAlreadyEnded`), an unknown run
        none either (:class:`~agentruns.domain.errors.RunNotFound`); nothing is written then."""
        limits.run_id(run_id)
        checked_name = _name(name, "a signal's name")
        if subject_policy.reserved(checked_name):
            raise InvalidRequest(
                f"signal names beginning {subject_policy.RESERVED_PREFIX!r} are agentruns' own "
                f"(a merge's input is one): not {limits.shown(checked_name)}"
            )
        checked = validate_payload({"payload": payload})["payload"]
        given = str(self._new_id()) if signal_id is None else _name(signal_id, "a signal's id")
        try:
            # What the wait will record must fit a recorded step: refused now, not at the wait.
            step_record(wait_step(checked_name), 1, {"signal_id": given, "payload": checked})
        except InvalidRequest as error:
            raise InvalidRequest(
                f"signal {checked_name!r} cannot be delivered: its payload with its name and id "
                f"must fit a recorded step of at most {limits.MAX_JSON_BYTES} bytes"
            ) from error
        async with self.transaction() as inner:
            found = await self._stores.runs.lock(inner, run_id)
            if found is None:
                raise RunNotFound(f"no run {run_id}")
            if found.state is AgentRunState.ENDED:
                before = [
                    kept
                    for kept in await self._stores.runs.signals(inner, run_id)
                    if kept.signal_id == given
                ]
                if before:
                    self._metrics.signalled(found.kind, False)
                    return Delivered(before[0], created=False)
                raise RunAlreadyEnded(
                    f"run {run_id} ended {found.end_reason}: it takes no signal {checked_name!r}"
                )
            delivered = await self._stores.runs.deliver_signal(
                inner, run_id, checked_name, given, checked
            )
            if delivered.created:
                await self._stores.runs.wake(inner, run_id, checked_name)
        # Counted once committed: a delivery rolled back is no signal.
        self._metrics.signalled(found.kind, delivered.created)
        return delivered

    async def inputs(self, run_id: UUID) -> list[JsonObject]:
        """The inputs the run answers (ADRs/0031): its payload as it was enqueued, then the
        payload of each enqueue that merged into it, in the order they joined. A merge joins
        only a run never claimed, so a claimed run's inputs no longer change: every attempt
        (and a replay of recorded steps) reads the same list. RunNotFound if no such run."""
        limits.run_id(run_id)
        async with self.transaction() as inner:
            run = await self._stores.runs.get(inner, run_id)
            if run is None:
                raise RunNotFound(f"no run {run_id}")
            return subject_policy.inputs(run, await self._stores.runs.signals(inner, run_id))

    async def signals(self, run_id: UUID) -> list[Signal]:
        """The signals delivered to the run, in delivery order (RunNotFound if none such)."""
        limits.run_id(run_id)
        async with self.transaction() as inner:
            if await self._stores.runs.get(inner, run_id) is None:
                raise RunNotFound(f"no run {run_id}")
            return await self._stores.runs.signals(inner, run_id)

    async def wait_point(
        self,
        fence: AgentRunFence,
        *,
        name: str | None,
        occurrence: int,
        longest: timedelta,
    ) -> JsonObject | None:
        """A holder's wait for the signal ``name`` for at most ``longest`` (``None``: a sleep of
        ``longest``), the ``occurrence``-th of its step in the run, in one transaction under the
        fence
        (ADRs/0025). The wait resolves when its signal was delivered (a wait) or its end has
        passed: its step is recorded with the lease renewed, and the record is returned. Else
        the run is given back, not due until the wait's end, and ``None`` is returned: the
        holder stops driving it. A resumed wait keeps the end it had."""
        _fence(fence)
        step = SLEEP_STEP if name is None else wait_step(name)
        async with self.transaction() as inner:
            found = await self._stores.runs.get(inner, fence.run_id)
            if found is None:
                raise RunNotFound(f"no run {fence.run_id}")
            # Lock order: the kind's domain row, then its run (a park moves the run).
            handler = self.handler_of(found)
            await handler.lock_domain_row(inner, found)
            await self._stores.runs.require_current(inner, fence)
            run = await self._stores.runs.get(inner, fence.run_id)
            now = await self._stores.runs.now(inner)
            assert run is not None
            result: JsonObject | None = None
            if name is not None:
                signal = await self._stores.runs.signal_of(inner, run.id, name, occurrence)
                if signal is not None:
                    result = signalled(signal)
            resumed = same_wait(run, name)
            until = run.waiting_until if resumed and run.waiting_until else now + longest
            since = run.waiting_since if resumed and run.waiting_since else now
            if result is None and until <= now:
                result = TIMED_OUT if name is not None else SLEPT
            if result is None:
                parked = await self._stores.runs.park(
                    inner, fence, waiting_for=name, until=until, since=since
                )
                await handler.on_moved(inner, parked)
                return None
            record = step_record(step, occurrence, result)
            await self._stores.events.renew_and_append(inner, fence, RECORDED_STEP, record)
            if run.waiting_until is not None or run.waiting_for is not None:
                await self._stores.runs.clear_wait(inner, fence)
            return record

    async def cancel(self, run_id: UUID) -> AgentRun:
        """End a queued or leased run CANCELLED at once; its holder's next renewal fails, and
        the holder is told on commit, so its running step is cancelled (ADRs/0023).

        A run whose kind is not registered here may still be cancelled if its kind kept no
        domain row when it was enqueued; one whose kind did raises UnknownKind, since only its
        handler can move that row.

        A claim locks a run before its domain row (it cannot know the row before it picks the
        run), so a cancel racing a claim of the same run can deadlock; the database aborts one
        side, and a cancel that lost runs again."""
        limits.run_id(run_id)
        for attempt in range(_CONFLICT_RETRIES):
            try:
                async with self.transaction() as inner:
                    found = await self._stores.runs.get(inner, run_id)
                    if found is None:
                        raise RunNotFound(f"no run {run_id}")
                    handler = self.handler_of(found)
                    await handler.lock_domain_row(inner, found)
                    run = await self._stores.runs.end(
                        inner, run_id, TerminationReason.CANCELLED, None
                    )
                    await handler.on_moved(inner, run)
                    return run
            except TransactionConflict:
                if attempt + 1 == _CONFLICT_RETRIES:
                    raise
        raise AssertionError("unreachable")

    def handler_of(self, run: AgentRun) -> AgentRunHandler:
        """The handler that moves ``run``'s domain row: its kind's; for a kind this process does
        not know, none if the run was enqueued without a domain row, else UnknownKind."""
        if run.kind in self._kinds:
            return self._kinds.get(run.kind).handler
        if run.domain_row:
            raise UnknownKind(run.kind)
        return NoDomainRow()

    async def retry(self, run_id: UUID) -> AgentRun:
        """Put a dead-lettered (or FAILED) run back to work as :meth:`continue_after` does: a new
        run with its epochs and one more attempt, refused once the kind's budget is spent, for a
        run that ended COMPLETED, CANCELLED or CONTINUED, and for one already continued (a
        second retry of the same run would do its work twice)."""
        limits.run_id(run_id)
        async with self.transaction() as inner:
            ended = await self._stores.runs.get(inner, run_id)
            if ended is None:
                raise RunNotFound(f"no run {run_id}")
            retry_after_end(ended)
            later = await self._stores.runs.continuation_of(inner, run_id)
        if later is not None:
            raise IllegalTransition(
                ended.state,
                AgentRunState.QUEUED,
                f"run {run_id} was already continued by run {later.id}: retry that one",
            )
        return await self.continue_after(run_id)

    async def continue_after(
        self,
        ended_run_id: UUID,
        *,
        payload: object = None,
        band: Band | str | int | None = None,
        due_at: datetime | None = None,
    ) -> AgentRun:
        """A new run that goes on where an ended one stopped: same kind, workspace and subject,
        its epochs, and one more attempt (refused once the kind's budget is spent)."""
        limits.run_id(ended_run_id)
        due = limits.optional_moment(due_at, "due_at")
        checked_payload = None if payload is None else validate_payload(payload)
        checked_band = None if band is None else Band.parse(band)
        async with self.transaction() as inner:
            ended = await self._stores.runs.get(inner, ended_run_id)
            if ended is None:
                raise RunNotFound(f"no run {ended_run_id}")
            kind = self._kinds.get(ended.kind)
            continuation = continue_after(ended, retry_budget=kind.policy.retry_budget)
            new = NewRun(
                id=self._new_id(),
                kind=ended.kind,
                workspace=ended.workspace,
                subject=ended.subject,
                band=ended.band if checked_band is None else checked_band,
                payload=ended.payload if checked_payload is None else checked_payload,
                lease=kind.policy.lease,
                due_at=due,
                deadline_after=kind.policy.deadline,
                epoch=continuation.epoch,
                attempt=continuation.attempt,
                continues=continuation.continues,
                domain_row=kind.handler.has_domain_row,
                # The continuation goes on in the trace of the work it continues.
                trace_context=ended.trace_context,
            )
            run = await self._stores.runs.insert(inner, new)
            await kind.handler.on_moved(inner, run)
            return run

    async def get(self, run_id: UUID) -> AgentRun:
        limits.run_id(run_id)
        async with self.transaction() as inner:
            run = await self._stores.runs.get(inner, run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id}")
        return run

    async def list_runs(
        self,
        *,
        workspace: str | None = None,
        subject: str | None = None,
        kind: str | None = None,
        state: AgentRunState | str | None = None,
        reason: TerminationReason | str | None = None,
        band: Band | str | int | None = None,
        enqueued_after: datetime | None = None,
        enqueued_before: datetime | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        """Runs matching every filter given, newest first (latest enqueued first), a page of up
        to ``limit`` (at most 1,000) at a time. Paging is by keyset: a page's ``next_cursor``
        continues exactly after its last run, whatever was enqueued meanwhile. ``kind`` may name
        a kind this process does not register; ``enqueued_after`` is inclusive and
        ``enqueued_before`` exclusive; a bad filter or cursor is
        :class:`~agentruns.domain.errors.InvalidRequest`."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise InvalidRequest(f"a page holds 1 to {MAX_PAGE} runs, not {limit!r}")
        # "waiting" names the queued runs that wait for a signal or sleep (ADRs/0025).
        waiting = state == WAITING
        query = RunQuery(
            workspace=None if workspace is None else _name(workspace, "workspace"),
            subject=None if subject is None else _name(subject, "subject"),
            kind=None if kind is None else _name(kind, "kind"),
            state=AgentRunState.QUEUED
            if waiting
            else None
            if state is None
            else _parse(AgentRunState, state, "state"),
            reason=None if reason is None else _parse(TerminationReason, reason, "reason"),
            band=None if band is None else Band.parse(band),
            enqueued_after=limits.optional_moment(enqueued_after, "enqueued_after"),
            enqueued_before=limits.optional_moment(enqueued_before, "enqueued_before"),
            before_seq=None if cursor is None else _seq_of(cursor),
            waiting=waiting,
            # One more than the page, to know whether another page follows.
            limit=limit + 1,
        )
        async with self.transaction() as inner:
            found = await self._stores.runs.list_runs(inner, query)
        page = found[:limit]
        more = len(found) > limit
        return RunPage(page, f"{_CURSOR_PREFIX}{page[-1].seq}" if more else None)

    async def events(
        self, run_id: UUID, *, after_seq: int = 0, limit: int | None = None
    ) -> list[RunEvent]:
        """The run's step events in order; with ``after_seq`` and ``limit``, a page of them
        (those after that event, at most ``limit``: a run may have many)."""
        limits.run_id(run_id)
        if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0:
            raise InvalidRequest(f"after_seq is a whole number, not {limits.shown(after_seq)}")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE
        ):
            raise InvalidRequest(f"a page holds 1 to {MAX_PAGE} events, not {limits.shown(limit)}")
        async with self.transaction() as inner:
            return await self._stores.events.list(
                inner, run_id, after_seq=min(after_seq, limits.MAX_EPOCH), limit=limit
            )

    def watch(self, run_id: UUID, *, after: int = 0) -> AsyncGenerator[RunUpdate, None]:
        """The run's events and state changes as they are committed, ending with the run: an
        async iterator of :class:`~agentruns.app.watch.RunUpdate`. The first item is the run's
        state now; then each event after event ``after`` (0: from the first), in order, once
        each, and a state item at each claim, give-back or requeue; the last item is the end
        (``update.ended``, with the run's end reason and result). ``after`` must name an event
        the run has (a resume point); a bad one is
        :class:`~agentruns.domain.errors.InvalidRequest`, an unknown run
        :class:`~agentruns.domain.errors.RunNotFound`, raised by the first iteration. Every
        watcher of the process is fed by the notifier's one listening connection and costs no
        query while its run is idle (ADRs/0030)."""
        return self._watcher.watch(run_id, after=after)

    async def wait(
        self,
        run_id: UUID,
        *,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 - it names the run in its error
    ) -> AgentRun:
        """The run once it has ended (its end reason and ``result`` included). With
        ``timeout`` (seconds or a timedelta, at most a day), raise
        :class:`~agentruns.domain.errors.RunWaitTimedOut` if it has not ended by then; the run
        goes on either way. An unknown run is :class:`~agentruns.domain.errors.RunNotFound`."""
        return await self._watcher.wait(run_id, timeout=timeout)

    async def continued_by(self, run_id: UUID) -> AgentRun | None:
        """The run that continues run ``run_id`` (a retry, or a host's ``continue_after``), if
        one does."""
        limits.run_id(run_id)
        async with self.transaction() as inner:
            return await self._stores.runs.continuation_of(inner, run_id)

    async def failures(self, run_id: UUID) -> list[FailureRecord]:
        """The run's failed attempts, oldest first: each with its error type, message, failure
        class, attempt, epoch, holder and a bounded, redacted traceback. RunNotFound if there
        is no such run (a purged run's records went with it)."""
        limits.run_id(run_id)
        async with self.transaction() as inner:
            if await self._stores.runs.get(inner, run_id) is None:
                raise RunNotFound(f"no run {run_id}")
            return await self._stores.runs.failures(inner, run_id)

    # Provider limits (ADRs/0032): named token buckets every worker of the database shares.

    async def declare_limit(self, limit: ProviderLimit) -> None:
        """Declare (or change) a provider limit; every process may declare it at start. A new
        limit starts full; a changed one keeps what it holds, at most its new burst."""
        if not isinstance(limit, ProviderLimit):
            raise InvalidRequest("declare_limit takes a ProviderLimit")
        async with self._stores.scope.statement() as tx:
            await self._stores.limits.declare(tx, limit)

    async def take(
        self,
        name: str,
        *,
        requests: int = 1,
        tokens: int = 0,
        wait: timedelta | None = timedelta(minutes=1),
        poll: float = 1.0,
    ) -> None:
        """Take ``requests`` and ``tokens`` from the limit ``name`` before a call to its provider,
        waiting while it is empty or paused: each try sleeps until the store says the limit could
        grant (at most ``poll`` seconds of this process's time, so that a pause or a refill on a
        test's manual clock is seen). Past ``wait`` of this process's time (``None``: no bound;
        zero: one try) it raises :class:`~agentruns.domain.errors.LimitExhausted`; an undeclared
        limit is :class:`~agentruns.domain.errors.UnknownLimit`."""
        limits.name(name, "a limit's name")
        check_take(requests, tokens)
        if wait is not None:
            limits.duration(wait, "a take's wait", longest=limits.MAX_DELAY, zero=True)
        if not poll > 0:
            raise InvalidRequest("a take's poll is longer than zero")
        deadline = None if wait is None else time.monotonic() + wait.total_seconds()
        while True:
            async with self._stores.scope.statement() as tx:
                answer = await self._stores.limits.take(tx, name, requests, tokens)
            if answer.granted:
                return
            retry_in = answer.wait.total_seconds()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise LimitExhausted(name, retry_in)
            await asyncio.sleep(min(retry_in, poll, left if left is not None else poll))

    async def pause_limit(self, name: str, until: datetime) -> None:
        """Grant nothing from the limit ``name`` until ``until`` (a provider's Retry-After), for
        every worker; a later pause it already has is kept."""
        limits.name(name, "a limit's name")
        limits.moment(until, "a pause's end")
        async with self._stores.scope.statement() as tx:
            await self._stores.limits.pause(tx, name, until)

    async def empty_limits(self, names: Sequence[str]) -> dict[str, timedelta]:
        """Of ``names``, the limits that could not grant one request (and token) now, with how
        long until they could (what a worker asks before it claims a limited kind)."""
        async with self._stores.scope.statement() as tx:
            return await self._stores.limits.empty(tx, names)

    async def limits(self) -> list[ProviderLimit]:
        """Every declared provider limit, by name."""
        async with self._stores.scope.statement() as tx:
            return await self._stores.limits.all(tx)

    async def purge(self, older_than: timedelta, *, batch: int = 1000) -> int:
        """Delete runs (and their events) that ended more than ``older_than`` ago (at most
        :data:`~agentruns.domain.limits.MAX_RETENTION`)."""
        if not isinstance(older_than, timedelta) or older_than < timedelta(0):
            raise InvalidRequest("purge needs a retention that is not negative")
        if older_than > limits.MAX_RETENTION:
            raise InvalidRequest(
                f"purge's retention is at most {limits.MAX_RETENTION.days} days, not "
                f"{older_than.days} days"
            )
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise InvalidRequest(f"purge needs a batch of at least one, not {limits.shown(batch)}")
        total = 0
        while True:
            async with self.transaction() as inner:
                cutoff = await self._stores.runs.now(inner) - older_than
                deleted = await self._stores.runs.purge(inner, cutoff, batch)
            total += deleted
            if deleted < batch:
                return total

    async def set_workspace_active(self, workspace: str, active: bool) -> None:
        if not isinstance(active, bool):
            raise InvalidRequest(f"active is True or False, not {limits.shown(active)}")
        async with self.transaction() as inner:
            await self._stores.workspaces.set_active(inner, _name(workspace, "workspace"), active)

    async def hold_budget(self, hold: BudgetHold) -> None:
        checked = _budget_hold(hold)
        async with self.transaction() as inner:
            await self._stores.workspaces.hold_budget(inner, checked)

    async def set_budget(self, budget: Budget) -> BudgetView:
        """Set the workspace's budget (ADRs/0033): at most ``budget.tokens`` tokens and/or
        ``budget.cost`` per UTC day or month, or over any ``budget.window`` of a rolling budget
        (held until enough of the window's spend ages out). The current period's spend is read
        from the usage ledger; the budget's own hold is lifted (a raised budget frees the
        workspace) and written again at once if the period's spend already reaches the new
        limit. A host's own hold is kept. Once the period's spend reaches a limit, the step
        boundary that crossed it holds the workspace until the period ends: its runs are not
        offered; a run in flight goes on to its end (the hold stops claims, not holders)."""
        if not isinstance(budget, Budget):
            raise InvalidRequest(f"a budget is an agentruns.Budget, not {type(budget).__name__}")
        if budget.rolling is not None:
            return await self._set_rolling_budget(budget)
        async with self.transaction() as inner:
            now = await self._stores.runs.now(inner)
            start, end = period_bounds(budget.period, now)
            spent = await self._stores.events.spend(inner, budget.workspace, start, end, "month")
            state = BudgetState(
                budget,
                start,
                sum(s.input_tokens + s.output_tokens for s in spent),
                sum((s.cost for s in spent), Decimal(0)),
            )
            await self._stores.workspaces.put_budget(inner, state)
            held_until = None
            if state.spent:
                await self._stores.workspaces.hold_budget(
                    inner, BudgetHold(budget.workspace, end, state.reason, by_budget=True)
                )
                held_until = await self._held_until(inner, budget.workspace)
            return BudgetView(state, held_until)

    async def _set_rolling_budget(self, budget: Budget) -> BudgetView:
        """A rolling budget set: its window's spend and hold read from the ledger now."""
        window = budget.rolling
        assert window is not None
        async with self.transaction() as inner:
            now = await self._stores.runs.now(inner)
            rows = await self._stores.events.window_usage(
                inner, budget.workspace, now - window, now
            )
            state = window_state(rows, budget, now)
            await self._stores.workspaces.put_budget(inner, state)
            until = rolling_hold_until(rows, budget, now)
            held_until = None
            if until is not None:
                await self._stores.workspaces.hold_budget(
                    inner, BudgetHold(budget.workspace, until, state.reason, by_budget=True)
                )
                held_until = await self._held_until(inner, budget.workspace)
            return BudgetView(state, held_until)

    async def remove_budget(self, workspace: str) -> bool:
        """Remove the workspace's budget and lift its budget's hold (a host's own hold stays);
        whether it had one."""
        name = _name(workspace, "workspace")
        async with self.transaction() as inner:
            return await self._stores.workspaces.remove_budget(inner, name)

    async def budget(self, workspace: str) -> BudgetView | None:
        """The workspace's budget, its current period's spend (a period that turned shows
        nothing spent yet; a rolling budget, its window's spend up to now) and until when its
        budget holds it (``None``: not held)."""
        name = _name(workspace, "workspace")
        async with self.transaction() as inner:
            state = await self._stores.workspaces.budget(inner, name)
            if state is None:
                return None
            now = await self._stores.runs.now(inner)
            window = state.budget.rolling
            if window is not None:
                rows = await self._stores.events.window_usage(inner, name, now - window, now)
                state = window_state(rows, state.budget, now)
            return BudgetView(state.at(now), await self._held_until(inner, name))

    async def _held_until(self, tx: Transaction, workspace: str) -> datetime | None:
        for hold in await self._stores.workspaces.holds(tx):
            if hold.workspace == workspace and hold.by_budget:
                return hold.until
        return None

    async def release_budget(self, workspace: str) -> None:
        _name(workspace, "workspace")
        async with self.transaction() as inner:
            await self._stores.workspaces.release_budget(inner, workspace)

    async def _lock_domain_row(self, tx: Transaction, run_id: UUID) -> RunKind:
        run = await self._stores.runs.get(tx, run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id}")
        kind = self._kinds.get(run.kind)
        await kind.handler.lock_domain_row(tx, run)
        return kind

    def _known(self, kinds: Sequence[str] | None) -> list[str] | None:
        if kinds is None:
            return None
        return [self._kinds.get(kind).name for kind in kinds]


def _reason(reason: object) -> TerminationReason:
    if isinstance(reason, TerminationReason):
        return reason
    raise InvalidRequest(f"an end reason is a TerminationReason, not {limits.shown(reason)}")


def _parse(enum: type[_E], value: object, what: str) -> _E:
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return enum(value)
    except ValueError:
        choices = ", ".join(member.value for member in enum)
        shown = limits.shown(value)
        raise InvalidRequest(f"no {what} {shown}: expected one of {choices}") from None


def _seq_of(cursor: object) -> int:
    text = cursor if isinstance(cursor, str) else ""
    digits = text.removeprefix(_CURSOR_PREFIX)
    if not text.startswith(_CURSOR_PREFIX) or not digits.isdigit() or len(digits) > 19:
        raise InvalidRequest(f"{limits.shown(cursor)} is not a cursor that list_runs gave")
    return int(digits)
