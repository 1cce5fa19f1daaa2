"""Run kinds: what a host registers so agentruns can lease, run and take back its work.

A kind is its :class:`~agentruns.domain.kinds.RunKindPolicy` (lease, retry budget, backoff,
deadline), an :class:`AgentRunHandler` that keeps the kind's own domain row agreeing with its run,
its steps, and optionally its own failure classifier (asked before the default rules). Steps are
an async generator over the run: each yielded :class:`StepEvent` is a step boundary, where the
worker renews the lease and only then persists the event, and a yielded :class:`RunResult` ends
the run with its result. Or they are
:class:`~agentruns.app.recorded.RecordedSteps`, plain async code whose steps' results are
recorded and replayed when the run is claimed again (ADRs/0022).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from agentruns.app.ports import BudgetHold, Transaction
from agentruns.domain.errors import (
    InvalidRunResult,
    InvalidSchedule,
    RecordedStepError,
    UnknownKind,
)
from agentruns.domain.failures import (
    ClassifiedFailure,
    FailureClass,
    KindClassifier,
    classify_failure,
)
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.payload import JsonObject, JsonValue
from agentruns.domain.run import AgentRun, RunChange
from agentruns.domain.schedule import Schedule, Schedules
from agentruns.domain.usage import Usage


@dataclass(frozen=True, slots=True)
class StepEvent:
    """What one step did, persisted in the run's event log after the lease was renewed; with
    ``usage``, what it spent, recorded in that same fenced write (ADRs/0033)."""

    type: str
    data: JsonObject = field(default_factory=dict)
    usage: Usage | None = None


# The type of the one thing a generator yields that is not a step (RunResult).
RESULT = "run.result"


@dataclass(frozen=True, slots=True, init=False)
class RunResult(StepEvent):
    """A generator's last yield: the run's result (ADRs/0026), not a step. The worker stops
    the steps there (the generator is closed: its ``finally`` runs, no later step is taken) and
    ends the run ``completed`` with ``result``, any JSON value, in the end's fenced write.
    Nothing is appended to the run's events."""

    result: JsonValue = None

    def __init__(self, result: JsonValue) -> None:
        object.__setattr__(self, "type", RESULT)
        object.__setattr__(self, "data", {})
        object.__setattr__(self, "usage", None)
        object.__setattr__(self, "result", result)


Steps = Callable[[AgentRun], AsyncIterator[StepEvent]]


class AgentRunHandler(Protocol):
    """The kind's hooks into its own domain row, called inside agentruns' transactions.

    Lock order everywhere is the domain row, then its run: agentruns calls
    :meth:`lock_domain_row` before it locks the run for a take-back, a cancel or an end.
    """

    @property
    def has_domain_row(self) -> bool:
        """Whether the kind keeps a row of its own that these hooks lock and move (the default).
        A handler that says no lets agentruns end its runs without the hooks: without reading
        the run first, and with other runs' ends in one transaction (ADRs/0011)."""
        return True

    async def lock_domain_row(self, tx: Transaction, run: AgentRun) -> None:
        """Lock the kind's row of ``run`` until the transaction ends."""
        ...

    async def on_take_back(self, tx: Transaction, run: AgentRun, change: RunChange) -> None:
        """The reaper is taking ``run`` back: move the domain row while the run still reads as
        its lost holder left it. ``change`` is what the take-back will write."""
        ...

    async def on_moved(self, tx: Transaction, run: AgentRun) -> None:
        """``run`` was enqueued, claimed, requeued or ended in this transaction, and now reads as
        given: move the domain row to agree."""
        ...

    async def check_budget(self, tx: Transaction, run: AgentRun) -> BudgetHold | None:
        """At claim time: a hold rolls the claim back (no epoch or attempt spent) and the
        workspace's runs wait until it ends."""
        ...


class NoDomainRow(AgentRunHandler):
    """The handler of a kind with no domain row of its own and no budget (a subclass may add a
    budget check at claim time)."""

    @property
    def has_domain_row(self) -> bool:
        return False

    async def lock_domain_row(self, tx: Transaction, run: AgentRun) -> None:
        return None

    async def on_take_back(self, tx: Transaction, run: AgentRun, change: RunChange) -> None:
        return None

    async def on_moved(self, tx: Transaction, run: AgentRun) -> None:
        return None

    async def check_budget(self, tx: Transaction, run: AgentRun) -> BudgetHold | None:
        return None


@dataclass(frozen=True, slots=True)
class RunKind:
    """A registered kind: its policy, its handler, its steps, and its classifier.

    ``classifier`` maps the errors of the kind's own providers to failure classes (returning
    ``None`` for an error it does not know, which the default rules then classify); see
    docs/failures.md for what the default rules read off model SDK errors.
    """

    policy: RunKindPolicy
    steps: Steps
    handler: AgentRunHandler = field(default_factory=NoDomainRow)
    classifier: KindClassifier | None = None

    @property
    def name(self) -> str:
        return self.policy.name

    def classify(self, error: BaseException, now: datetime | None = None) -> ClassifiedFailure:
        """The failure class of a step's error: the kind's classifier first, then the defaults.
        A recorded step's own refusal (:class:`RecordedStepError`) and a result that cannot be
        stored (:class:`InvalidRunResult`) are ``configuration`` whatever the classifier says:
        a retry would meet them again (ADRs/0022, 0026)."""
        if isinstance(error, (RecordedStepError, InvalidRunResult)):
            return ClassifiedFailure(FailureClass.CONFIGURATION)
        return classify_failure(error, self.classifier, now)


class RunKinds:
    """The registry of kinds and the schedules of their runs; built at composition time,
    read-only while workers run. A schedule names a kind registered here."""

    def __init__(
        self, kinds: Iterable[RunKind] = (), *, schedules: Iterable[Schedule] = ()
    ) -> None:
        self._kinds: dict[str, RunKind] = {}
        self._domain_rows = False
        self._plain = True
        self._schedules = Schedules()
        for kind in kinds:
            self.register(kind)
        for schedule in schedules:
            self.schedule(schedule)

    def register(self, kind: RunKind) -> None:
        if kind.name in self._kinds:
            raise ValueError(f"run kind {kind.name!r} is registered twice")
        self._kinds[kind.name] = kind
        self._domain_rows = self._domain_rows or kind.handler.has_domain_row
        self._plain = self._plain and type(kind.handler) is NoDomainRow

    def schedule(self, schedule: Schedule) -> None:
        """Declare a schedule of runs of a registered kind (synced to the table on start)."""
        if schedule.kind not in self._kinds:
            raise InvalidSchedule(
                f"schedule {schedule.name!r} runs kind {schedule.kind!r}, which is not registered"
            )
        self._schedules.add(schedule)

    @property
    def schedules(self) -> Schedules:
        return self._schedules

    @property
    def any_domain_rows(self) -> bool:
        """Whether some kind's handler keeps a domain row (``handler.has_domain_row``): if none
        does, a settle need not read its run to find the row to lock first."""
        return self._domain_rows

    @property
    def plain(self) -> bool:
        """Whether every kind's handler is the plain :class:`NoDomainRow` (no domain row, no
        budget check, nothing to do when a run moves): then a claim is its one statement."""
        return self._plain

    def get(self, name: str) -> RunKind:
        found = self._kinds.get(name) if isinstance(name, str) else None
        if found is None:
            raise UnknownKind(name)
        return found

    def names(self) -> list[str]:
        return sorted(self._kinds)

    def __contains__(self, name: object) -> bool:
        return name in self._kinds
