"""The ports: what the use cases need of the world, as async Protocols.

Adapters subclass these explicitly (``class PostgresRunStore(RunStore)``) so mypy checks them. A
:class:`Transaction` is opaque to the app: it is opened by a :class:`TransactionScope` and handed
back to the stores of the same adapter family, which know what it holds (a connection for
PostgreSQL, an undo log for memory). Every store method runs inside the transaction it is given
and commits nothing itself.

Time: stores decide on their own clock (the database clock for PostgreSQL, unless a test pins a
:class:`Clock`), so a use case never compares times it read in Python with times in a row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol
from uuid import UUID

from agentruns.domain.bands import Band
from agentruns.domain.budgets import BudgetState
from agentruns.domain.claim_order import SubjectKey
from agentruns.domain.errors import AgentRunsError
from agentruns.domain.failure_records import FailureDetail, FailureRecord
from agentruns.domain.holders import Holder, HolderBeat
from agentruns.domain.payload import JsonObject, JsonValue
from agentruns.domain.provider_limits import ProviderLimit, TakeAnswer
from agentruns.domain.run import AgentRun, AgentRunFence
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from agentruns.domain.usage import Per, Spend, Usage, UsageRecord, WorkspaceSpend
from agentruns.domain.waits import Delivered, Signal


class Clock(Protocol):
    """Where adapters read the time. Only clock adapters read the system clock."""

    def now(self) -> datetime: ...


class Transaction(Protocol):
    """An open unit of work. Stores of the adapter family that opened it know its insides."""


class TransactionScope(Protocol):
    """Opens transactions: committed when the block exits normally, rolled back on an error."""

    def transaction(self) -> AbstractAsyncContextManager[Transaction]: ...

    def savepoint(self, tx: Transaction) -> AbstractAsyncContextManager[None]:
        """A nested scope in ``tx``: an error inside undoes only what the scope wrote."""
        ...

    def statement(self) -> AbstractAsyncContextManager[Transaction]:
        """A scope for a use case that writes in ONE statement (reads may follow it): each
        statement commits on its own, so the scope costs no round trip to begin or commit.
        Never for two writes that must commit together."""
        ...


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run to insert, already validated by :class:`agentruns.app.runs.AgentRuns`.

    ``due_at=None`` means due now (on the store's clock); ``epoch``, ``attempt`` and ``continues``
    are set only when a run continues an ended one. ``domain_row`` and ``trace_context`` are
    stored as :class:`~agentruns.domain.run.AgentRun` describes them; ``key`` is the enqueue
    key (:meth:`RunStore.insert_keyed` and :meth:`RunStore.rekey` take it, ``insert`` stores it
    without taking it).
    """

    id: UUID
    kind: str
    workspace: str
    subject: str
    band: Band
    payload: JsonObject
    lease: timedelta
    due_at: datetime | None = None
    deadline_at: datetime | None = None
    deadline_after: timedelta | None = None
    epoch: int = 0
    attempt: int = 0
    continues: UUID | None = None
    domain_row: bool = False
    trace_context: dict[str, str] | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class NewFailure:
    """A failed attempt to record on run ``run_id``, which must still be LEASED at ``epoch``."""

    run_id: UUID
    epoch: int
    detail: FailureDetail


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What a claimer asks for: up to ``limit`` runs, at most one per subject, in claim order.

    ``kinds`` restricts the kinds offered (``None``: every kind); ``subject`` restricts the claim
    to one subject, named within its workspace (a sandbox's ``claim_subject``).
    """

    holder: str
    limit: int = 1
    kinds: Sequence[str] | None = None
    subject: SubjectKey | None = None
    band_aging: timedelta = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Which runs to list, newest first (by queue order, descending): every filter given must
    match (``enqueued_after`` inclusive, ``enqueued_before`` exclusive). ``before_seq`` is the
    keyset: only runs queued before the run with that queue order
    (the last one of the previous page). Validated by :meth:`AgentRuns.list_runs`."""

    workspace: str | None = None
    subject: str | None = None
    kind: str | None = None
    state: AgentRunState | None = None
    reason: TerminationReason | None = None
    band: Band | None = None
    enqueued_after: datetime | None = None
    enqueued_before: datetime | None = None
    before_seq: int | None = None
    limit: int = 50
    # Only waiting runs (queued, with a wait's end: ADRs/0025); with ``state`` QUEUED.
    waiting: bool = False


@dataclass(frozen=True, slots=True)
class TakeBack:
    """How the reaper takes back one expired lease: the kind's budget and this backoff delay;
    with ``failure``, the failed attempt recorded with it (``take_back_many`` writes both)."""

    run_id: UUID
    epoch: int
    retry_budget: int
    delay: timedelta
    failure: FailureDetail | None = None


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One persisted step event of a run; ``seq`` is unique and gapless per run."""

    run_id: UUID
    seq: int
    epoch: int
    type: str
    data: JsonObject = field(compare=False)
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StepWrite:
    """One step boundary of a group: renew under ``fence``, then append the event (and record
    its ``usage``, if it reported any: ADRs/0033)."""

    fence: AgentRunFence
    type: str
    data: JsonObject
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class RenewWrite:
    """One heartbeat of a group: renew the lease under ``fence``, nothing else (ADRs/0023)."""

    fence: AgentRunFence


@dataclass(frozen=True, slots=True)
class EndWrite:
    """One holder's end of a group: end the run under ``fence`` with ``reason``, and with its
    ``result`` (a checked JSON value; ``None``: none) in the same write (ADRs/0026)."""

    fence: AgentRunFence
    reason: TerminationReason
    result: JsonValue = None


class RunStore(Protocol):
    """The runs table: named transitions, each applied only if the run is still as expected.

    Fenced writes (``require_current``, ``renew``, ``end`` with a fence, ``requeue``) raise
    :class:`~agentruns.domain.errors.StaleEpoch` or
    :class:`~agentruns.domain.errors.LeaseExpired` and write nothing when the fence does not hold;
    a missing run raises :class:`~agentruns.domain.errors.RunNotFound`.
    """

    async def now(self, tx: Transaction) -> datetime:
        """The store's current time (the database clock, or the pinned test clock)."""
        ...

    async def insert(self, tx: Transaction, new: NewRun) -> AgentRun:
        """Insert a QUEUED run: the next queue order, ``enqueued_at`` now, and a wake-up
        notification sent when the transaction commits."""
        ...

    async def insert_keyed(self, tx: Transaction, new: NewRun) -> AgentRun | None:
        """Take ``new.key`` in ``new.workspace`` for ``new`` and insert it (as :meth:`insert`),
        if no run holds that key yet; else ``None``, nothing written. Two transactions racing
        for one new key: the second waits for the first to commit, then gets ``None``."""
        ...

    async def key_holder(
        self, tx: Transaction, workspace: str, key: str
    ) -> tuple[UUID, datetime] | None:
        """The run ``key`` names in ``workspace`` (even one since purged) and the store's now,
        locking the key until the transaction ends; ``None`` if the key names no run. The run
        is read in a statement of its own (:meth:`get`): a locking read joined to the run would
        see the run the key named before a concurrent move, not the one it names now."""
        ...

    async def rekey(self, tx: Transaction, new: NewRun) -> AgentRun:
        """Point ``new.key`` (locked by :meth:`key_holder` in this transaction) at ``new`` and
        insert it: the key's run ended past its retention or was purged."""
        ...

    async def lock_subject(self, tx: Transaction, workspace: str, subject: str) -> None:
        """Hold the subject against every other insert of one of its runs until the transaction
        ends (each insert takes the same lock), so that what :meth:`active_runs` reads next stays
        the subject's whole set of active runs but for claims, requeues and ends (ADRs/0028)."""
        ...

    async def active_runs(self, tx: Transaction, workspace: str, subject: str) -> list[AgentRun]:
        """The subject's runs that have not ended (queued, waiting or leased), as of this
        statement, in queue order. Locks nothing."""
        ...

    async def get(self, tx: Transaction, run_id: UUID) -> AgentRun | None: ...

    async def lock(self, tx: Transaction, run_id: UUID) -> AgentRun | None:
        """Read and lock the run until the transaction ends (``FOR UPDATE``)."""
        ...

    async def list_runs(self, tx: Transaction, query: RunQuery) -> list[AgentRun]:
        """Up to ``query.limit`` runs matching its filters, newest first (highest queue order
        first), queued before ``query.before_seq`` if given. Locks nothing."""
        ...

    async def claim(self, tx: Transaction, request: ClaimRequest) -> list[AgentRun]:
        """Lease up to ``request.limit`` runs in the domain's claim order, each under its next
        epoch, skipping rows other transactions hold locked."""
        ...

    async def claim_with_room(
        self, tx: Transaction, request: ClaimRequest, limited: Mapping[str, tuple[str, ...]]
    ) -> tuple[list[AgentRun], dict[str, timedelta]]:
        """As :meth:`claim` (``request.kinds`` given), leasing no run of a kind whose provider
        limits (``limited``: kind -> limit names) could not grant one request and one token now
        (:func:`~agentruns.domain.provider_limits.with_room`), in one read with the claim where
        the store can (ADRs/0032); and those empty limits, with how long until each could."""
        ...

    async def require_current(self, tx: Transaction, fence: AgentRunFence) -> AgentRun:
        """Lock the run and check the fence: the lease is held until the transaction ends."""
        ...

    async def renew(self, tx: Transaction, fence: AgentRunFence) -> AgentRun: ...

    async def renew_many(
        self, tx: Transaction, fences: Sequence[AgentRunFence]
    ) -> list[AgentRunsError | None]:
        """:meth:`renew` for each fence, set-based (the heartbeat of a group, ADRs/0023); one
        result per fence, in order: ``None`` (renewed; the run is not read back), or what
        ``renew`` would have raised for it (nothing written for it). The fences name distinct
        runs."""
        ...

    async def end(
        self,
        tx: Transaction,
        run_id: UUID,
        reason: TerminationReason,
        fence: AgentRunFence | None,
        result: JsonValue = None,
    ) -> AgentRun:
        """End the run. With a fence, only its current holder may, and its ``result`` (a checked
        JSON value, ``None``: none) is written with the end; without one (a cancel), a
        QUEUED or LEASED run ends at once with no result, and a LEASED run's holder is told on
        commit (:meth:`Notifier.on_cancel`). An ENDED run raises IllegalTransition."""
        ...

    async def end_many(
        self, tx: Transaction, ends: Sequence[EndWrite], *, ended_runs: bool = True
    ) -> list[AgentRun | AgentRunsError | None]:
        """End each run under its own fence, set-based; one result per write, in order: the
        ended run (``None`` without ``ended_runs``: the end held, nothing read back), or what
        :meth:`end` would have raised for it (its fence failed, nothing written for it). A
        failed fence neither blocks nor rolls back the others. The writes name distinct runs:
        :meth:`AgentRuns.settle_group` checks that, once, for both."""
        ...

    async def requeue(
        self,
        tx: Transaction,
        fence: AgentRunFence,
        *,
        charged: bool,
        delay: timedelta,
        retry_budget: int,
    ) -> AgentRun:
        """LEASED -> QUEUED, due after ``delay``; a charged requeue spends an attempt (refused
        with RetryBudgetExhausted past ``retry_budget``). Notifies on commit."""
        ...

    async def park(
        self,
        tx: Transaction,
        fence: AgentRunFence,
        *,
        waiting_for: str | None,
        until: datetime,
        since: datetime,
    ) -> AgentRun:
        """A wait or a sleep (ADRs/0025): LEASED -> QUEUED under the fence, no attempt spent,
        due at ``until`` (not before now), waiting for the signal ``waiting_for`` (``None``: a
        sleep) since ``since`` until ``until``; the run stays its subject's head."""
        ...

    async def postpone(self, tx: Transaction, run_id: UUID, due_at: datetime) -> AgentRun:
        """A merge's debounce (ADRs/0031): the run, locked by this transaction, queued and never
        claimed, is due at ``due_at`` (later than it was). Nothing else of it changes."""
        ...

    async def clear_wait(self, tx: Transaction, fence: AgentRunFence) -> None:
        """The leased run's wait resolved (its step is recorded): it waits for nothing."""
        ...

    async def wake(self, tx: Transaction, run_id: UUID, name: str) -> bool:
        """If the run is queued waiting for the signal ``name``: due now, waiting no more, and
        the claimers woken on commit (as an enqueue wakes them). Whether it was."""
        ...

    async def deliver_signal(
        self, tx: Transaction, run_id: UUID, name: str, signal_id: str, payload: JsonValue
    ) -> Delivered:
        """Keep the signal, once per (run, ``signal_id``): a second delivery of the id writes
        nothing and answers the first's signal (``created`` False)."""
        ...

    async def signal_of(
        self, tx: Transaction, run_id: UUID, name: str, occurrence: int
    ) -> Signal | None:
        """The ``occurrence``-th signal named ``name`` delivered to the run (from 1), if any."""
        ...

    async def signals(self, tx: Transaction, run_id: UUID) -> list[Signal]:
        """The run's signals in delivery order."""
        ...

    async def expired(
        self, tx: Transaction, limit: int, kinds: Sequence[str] | None = None
    ) -> list[AgentRun]:
        """LEASED runs whose lease has passed, oldest expiry first, skipping locked rows; only
        of ``kinds`` if given (a reaper takes back only the kinds it knows)."""
        ...

    async def expired_kinds(self, tx: Transaction, excluding: Sequence[str]) -> dict[str, int]:
        """Expired leases of kinds not in ``excluding``, counted by kind: the runs a reaper that
        knows only ``excluding`` leaves for a replica that knows their kind."""
        ...

    async def take_back(self, tx: Transaction, take_back: TakeBack) -> AgentRun | None:
        """Apply the domain's take-back if the run is still LEASED at ``take_back.epoch`` and
        expired; ``None`` (nothing written) when a renewal or another replica won."""
        ...

    async def take_back_many(
        self, tx: Transaction, take_backs: Sequence[TakeBack]
    ) -> list[AgentRun]:
        """:meth:`take_back` for many runs at once, set-based (runs of kinds without a domain
        row): each still conditional on its epoch and expiry, so a renewal that committed first
        wins. The runs taken back, in no particular order; one that lost is not among them."""
        ...

    async def overdue(
        self, tx: Transaction, limit: int, kinds: Sequence[str] | None = None
    ) -> list[AgentRun]:
        """QUEUED runs past their deadline, without locking them (the reaper ends each in its
        own transaction, domain row first); only of ``kinds`` if given."""
        ...

    async def record_failure(self, tx: Transaction, failure: NewFailure) -> FailureRecord:
        """Append a failed attempt to the run's records and make it the run's last failure.

        Only while the run is LEASED at ``failure.epoch`` (else StaleEpoch, nothing written):
        the holder records in the transaction of its fenced requeue or end, before it, so a
        refused fence rolls the record back too; the reaper records before its take-back. The
        row keeps its state, so nothing but this write happens: no head moves, no wake-up."""
        ...

    async def failures(self, tx: Transaction, run_id: UUID) -> list[FailureRecord]:
        """The run's failed attempts, oldest first (empty for a run that never failed)."""
        ...

    async def continuation_of(self, tx: Transaction, run_id: UUID) -> AgentRun | None:
        """The run that continues run ``run_id`` (its ``continues``), if one does."""
        ...

    async def ids_between(self, tx: Transaction, low: UUID, high: UUID, limit: int) -> list[UUID]:
        """Up to ``limit`` run ids from ``low`` to ``high`` (both included), in UUID order: the
        runs whose id starts with a prefix (an index range, never a scan)."""
        ...

    async def purge(self, tx: Transaction, ended_before: datetime, limit: int) -> int:
        """Delete up to ``limit`` runs ended before ``ended_before`` (with their events)."""
        ...

    async def archive(self, tx: Transaction, limit: int) -> int:
        """Move up to ``limit`` ended runs not moved yet out of the store's hot path, first in
        queue order; answer how many moved. Nothing a reader sees changes: a run reads the same
        wherever it is (ADRs/0035)."""
        ...

    async def leased_count(self, tx: Transaction, workspace: str) -> int: ...

    async def watch(self, tx: Transaction, run_id: UUID, watcher: UUID) -> None:
        """Say that ``watcher`` watches run ``run_id``, so that the run's events and state
        changes are announced to :meth:`Notifier.on_run` subscribers from now on (ADRs/0030);
        a run that does not exist raises :class:`~agentruns.domain.errors.RunNotFound`."""
        ...

    async def unwatch(self, tx: Transaction, run_id: UUID, watcher: UUID) -> None:
        """Undo :meth:`watch` (nothing if it was not, or the run is gone)."""
        ...


class EventLog(Protocol):
    """Step events of runs. Appends are fenced: a zombie holder never appends."""

    async def append(
        self, tx: Transaction, fence: AgentRunFence, type: str, data: JsonObject
    ) -> RunEvent: ...

    async def renew_and_append(
        self,
        tx: Transaction,
        fence: AgentRunFence,
        type: str,
        data: JsonObject,
        usage: Usage | None = None,
    ) -> RunEvent:
        """A step boundary as one operation: renew the lease under ``fence`` (as
        :meth:`RunStore.renew`) and append the event only if the renewal held; on a fence
        that does not hold, raise as ``renew`` does and append nothing. With ``usage`` (not
        empty), the same operation adds it to the run's totals and records it in the usage
        ledger at the event's seq (ADRs/0033); a refused fence records none of it."""
        ...

    async def spend(
        self, tx: Transaction, workspace: str, since: datetime, until: datetime, per: Per
    ) -> list[Spend]:
        """The workspace's usage ledger at ``since <= at < until``, grouped as
        :func:`agentruns.domain.usage.spend` groups it (purged runs' usage included)."""
        ...

    async def spend_by_workspace(
        self, tx: Transaction, since: datetime, until: datetime
    ) -> list[WorkspaceSpend]:
        """Every workspace's usage at ``since <= at < until``, summed and ordered as
        :func:`agentruns.domain.usage.spend_by_workspace` does."""
        ...

    async def window_usage(
        self, tx: Transaction, workspace: str, after: datetime, upto: datetime
    ) -> list[UsageRecord]:
        """The workspace's ledger rows at ``after < at <= upto`` (a rolling budget's window,
        ADRs/0033), oldest first."""
        ...

    async def renew_and_append_many(
        self, tx: Transaction, steps: Sequence[StepWrite]
    ) -> list[RunEvent | AgentRunsError]:
        """:meth:`renew_and_append` for each write, set-based; one result per write, in order:
        the appended event, or what ``renew_and_append`` would have raised for it (its fence
        failed: not renewed, nothing appended). The writes name distinct runs (checked once, by
        :meth:`AgentRuns.settle_group`)."""
        ...

    async def list(
        self, tx: Transaction, run_id: UUID, *, after_seq: int = 0, limit: int | None = None
    ) -> list[RunEvent]:
        """The run's events in order: those after ``after_seq``, at most ``limit`` of them."""
        ...


@dataclass(frozen=True, slots=True)
class BudgetHold:
    """A workspace's budget is held until ``until``: its runs are not offered until then.
    ``by_budget``: written by the workspace's :class:`~agentruns.domain.budgets.Budget` when its
    period's spend reached a limit (ADRs/0033), lifted when the budget is raised or removed; a
    host's own hold is never one, and a budget never replaces it."""

    workspace: str
    until: datetime
    reason: str = ""
    by_budget: bool = False


class WorkspaceStore(Protocol):
    """Workspace facts the claim reads: the active flag and budget holds.

    A workspace that was never written is active and holds no budget.
    """

    async def set_active(self, tx: Transaction, workspace: str, active: bool) -> None: ...

    async def hold_budget(self, tx: Transaction, hold: BudgetHold) -> None:
        """Hold the workspace's budget until ``hold.until`` (a later hold replaces it)."""
        ...

    async def release_budget(self, tx: Transaction, workspace: str) -> None: ...

    async def holds(self, tx: Transaction) -> list[BudgetHold]:
        """The holds still in force now."""
        ...

    async def budget(self, tx: Transaction, workspace: str) -> BudgetState | None:
        """The workspace's budget as last charged (its period not turned yet), if it has one."""
        ...

    async def put_budget(self, tx: Transaction, state: BudgetState) -> None:
        """Set the workspace's budget with its period's start and spend, and lift its budget's
        hold (a host's own hold stays); the caller writes the hold again if still spent."""
        ...

    async def remove_budget(self, tx: Transaction, workspace: str) -> bool:
        """Remove the workspace's budget and its budget's hold; whether it had one."""
        ...


class HolderStore(Protocol):
    """The holders' rows: one per process that leases runs, written by its heartbeat off the
    claim path (:class:`~agentruns.app.holders.HolderHeartbeat`). Times are the store's own (the
    database clock, or the pinned test clock); the domain judges the rows
    (:mod:`agentruns.domain.holders`)."""

    async def started(self, tx: Transaction, beat: HolderBeat) -> Holder:
        """The holder starts now: started and seen now, not stopped. A row of the same name (a
        former life of the holder) is replaced."""
        ...

    async def seen(self, tx: Transaction, beat: HolderBeat) -> Holder:
        """The holder is alive now: seen now, with the beat's process, kinds and renewal, not
        stopped; its start is kept (a row forgotten meanwhile is written again, started now)."""
        ...

    async def stopped(self, tx: Transaction, holder: str) -> None:
        """The holder shut down cleanly: stopped and seen now. No row, nothing written."""
        ...

    async def all(self, tx: Transaction) -> list[Holder]:
        """Every row, by holder name."""
        ...

    async def forget(self, tx: Transaction, older_than: timedelta) -> int:
        """Delete the rows not seen for longer than ``older_than``; how many."""
        ...


class LimitStore(Protocol):
    """Provider limits (ADRs/0032): one token-bucket row per named limit, shared by every worker
    of the database, on the store's own clock. The rule is
    :mod:`agentruns.domain.provider_limits`; a name never declared is
    :class:`~agentruns.domain.errors.UnknownLimit` for a take or a pause."""

    async def declare(self, tx: Transaction, limit: ProviderLimit) -> None:
        """Write the definition: a new limit starts full, a changed one keeps its level (at most
        its new bursts) and its pause."""
        ...

    async def take(self, tx: Transaction, name: str, requests: int, tokens: int) -> TakeAnswer:
        """Take the amounts now if the limit grants them, else how long until it could."""
        ...

    async def pause(self, tx: Transaction, name: str, until: datetime) -> None:
        """Grant nothing until ``until`` (or the later pause it already has)."""
        ...

    async def empty(self, tx: Transaction, names: Sequence[str]) -> dict[str, timedelta]:
        """Of ``names``, those that could not grant one request and one token now, with how long
        until they could; a name never declared limits nothing."""
        ...

    async def all(self, tx: Transaction) -> list[ProviderLimit]:
        """Every declared limit, by name."""
        ...


class Notifier(Protocol):
    """Wakes idle claimers when a run is queued (PostgreSQL: NOTIFY on channel ``agent_run``),
    and tells holders that a leased run was ended under them (a cancel; PostgreSQL: NOTIFY on
    channel ``agent_run_cancel``, on the same listening connection)."""

    async def wait(self, seconds: float) -> bool:
        """Wait until a run is queued or ``seconds`` pass; True if woken. A poll fallback: the
        caller claims after either."""
        ...

    async def listen(self) -> bool:
        """Start listening now, so that no wake-up sent after this call is missed; a worker
        calls it before its first claim. False if it could not (the poll still works)."""
        return True

    def on_cancel(self, callback: Callable[[UUID], None]) -> Callable[[], None]:
        """Call ``callback(run_id)`` when a leased run is ended under its holder (a cancel),
        after the end commits; the answer unsubscribes. A hint, not a guarantee: a
        notification can be missed (PostgreSQL hears it only while someone waits on this
        notifier or after, and not while it cannot listen), so a holder still learns it at its
        next fenced write (ADRs/0023). The callback runs in the event loop and must not block."""
        ...

    def on_run(self, run_id: UUID, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after a commit that appended an event to run ``run_id`` or
        changed its state, while the run is watched (:meth:`RunStore.watch`); the answer
        unsubscribes. A hint that the run may have changed, never what changed: a watcher
        reads the run again, so a spurious call costs one read. It is also called when
        notifications may have been missed (a lost connection: ADRs/0030). The callback runs in
        the event loop and must not block."""
        ...


class CancelSubscribers:
    """The :meth:`Notifier.on_cancel` subscribers of one notifier, told in subscription order;
    one subscriber's bug is logged and stops neither the others nor the caller."""

    __slots__ = ("_callbacks",)

    def __init__(self) -> None:
        self._callbacks: list[Callable[[UUID], None]] = []

    def subscribe(self, callback: Callable[[UUID], None]) -> Callable[[], None]:
        """Add ``callback``; the answer removes it (a second call does nothing)."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    def tell(self, run_id: UUID) -> None:
        for callback in list(self._callbacks):
            try:
                callback(run_id)
            except Exception:
                logging.getLogger("agentruns.notifier").exception("a cancel subscriber failed")


class RunSubscribers:
    """The :meth:`Notifier.on_run` subscribers of one notifier, by run; one subscriber's bug
    is logged and stops neither the others nor the caller."""

    __slots__ = ("_callbacks",)

    def __init__(self) -> None:
        self._callbacks: dict[UUID, list[Callable[[], None]]] = {}

    def __bool__(self) -> bool:
        return bool(self._callbacks)

    def watched(self, run_id: UUID) -> bool:
        return run_id in self._callbacks

    def subscribe(self, run_id: UUID, callback: Callable[[], None]) -> Callable[[], None]:
        """Add ``callback`` for ``run_id``; the answer removes it (a second call does nothing)."""
        self._callbacks.setdefault(run_id, []).append(callback)

        def unsubscribe() -> None:
            callbacks = self._callbacks.get(run_id)
            if callbacks is not None and callback in callbacks:
                callbacks.remove(callback)
                if not callbacks:
                    del self._callbacks[run_id]

        return unsubscribe

    def tell(self, run_id: UUID) -> None:
        for callback in list(self._callbacks.get(run_id, ())):
            self._call(callback)

    def tell_all(self) -> None:
        for callbacks in list(self._callbacks.values()):
            for callback in list(callbacks):
                self._call(callback)

    @staticmethod
    def _call(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            logging.getLogger("agentruns.notifier").exception("a run subscriber failed")


@dataclass(frozen=True, slots=True)
class Stores:
    """One adapter family's stores, sharing one transaction scope (what the container builds)."""

    scope: TransactionScope
    runs: RunStore
    events: EventLog
    workspaces: WorkspaceStore
    notifier: Notifier
    limits: LimitStore
