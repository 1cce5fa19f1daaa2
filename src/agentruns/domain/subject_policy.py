"""What an enqueue does when its subject already has an active run (ADRs/0028).

A subject's *active* runs are those that have not ended: its leased run, and its queued runs
(waiting ones included). An enqueue chooses a policy (``on_active=``), or takes its kind's
(``RunKindPolicy.on_active``, ``queue`` unless the kind says otherwise):

- ``queue``: the new run is queued behind the active ones (the subject's FIFO);
- ``reject``: nothing is written, and :class:`SubjectBusy` names the active run;
- ``interrupt``: every active run is ended ``cancelled`` (a leased one's holder is told, and its
  running step is cancelled: ADRs/0023), and the new run is the subject's next, in one
  transaction;
- ``merge``: if the subject's newest active run was never claimed (:func:`joinable`), the new
  work joins it as one more of its inputs (:func:`inputs`) and no run is made; else it is
  queued as ``queue`` does. With a debounce, each merge moves the joined run's due time later
  (:func:`debounced_due`), bounded by a longest wait from its enqueue (ADRs/0031).

Pure: the store hands in the subject's active runs, read under the subject's lock.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from agentruns.domain import limits
from agentruns.domain.errors import InvalidPayload, InvalidRequest, SubjectBusy
from agentruns.domain.payload import JsonObject, validate_payload
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.waits import Signal

# The signal a merge delivers to the run it joins: one per merged enqueue, its payload the new
# work's payload. The ``agentruns:`` prefix is reserved; a host's signal may not take it.
MERGED = "agentruns:merged"
RESERVED_PREFIX = "agentruns:"


class OnActive(enum.StrEnum):
    """What an enqueue does when its subject has a run that has not ended."""

    QUEUE = "queue"
    REJECT = "reject"
    INTERRUPT = "interrupt"
    MERGE = "merge"

    @classmethod
    def parse(cls, value: object) -> OnActive:
        """``value`` as a policy (an ``OnActive`` or its name), else InvalidRequest."""
        if isinstance(value, OnActive):
            return value
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                pass
        names = ", ".join(member.value for member in cls)
        raise InvalidRequest(f"on_active is one of {names}, not {limits.shown(value)}")


@dataclass(frozen=True, slots=True)
class Insert:
    """Insert the new run; end ``interrupt`` (the subject's active runs) first, cancelled."""

    interrupt: tuple[AgentRun, ...] = ()


@dataclass(frozen=True, slots=True)
class Join:
    """Insert nothing: the new work joins ``into``, the subject's newest active run, which was
    never claimed."""

    into: AgentRun


def joinable(run: AgentRun) -> bool:
    """Whether new work may still join ``run``: it is queued and was never claimed (epoch 0;
    each claim takes the next epoch, so a run that was leased once, and every run waiting for
    a signal or asleep, is at epoch 1 or more). A run that was never claimed has shown its
    inputs to nobody, so its kind reads them all at its first claim and at every later one."""
    return run.state is AgentRunState.QUEUED and run.epoch == 0 and run.waiting_until is None


def active(runs: Sequence[AgentRun]) -> list[AgentRun]:
    """The runs of ``runs`` that have not ended, leased first, then in queue order."""
    alive = [run for run in runs if run.state is not AgentRunState.ENDED]
    return sorted(alive, key=lambda run: (run.state is not AgentRunState.LEASED, run.seq))


def decide(policy: OnActive, runs: Sequence[AgentRun], *, kind: str) -> Insert | Join:
    """What an enqueue under ``policy`` does, given its subject's runs (ended ones are ignored):
    an :class:`Insert`, a :class:`Join` (``merge``, when the subject's newest active run is
    :func:`joinable`), or :class:`SubjectBusy` (``reject`` on an active subject).

    A merge joins only the *newest* active run, and only one of the new work's ``kind``:
    joining an older one while a later run waits behind it would answer the new work before
    that run's, out of the subject's order; a run of another kind would not know the input."""
    alive = active(runs)
    if not alive or policy is OnActive.QUEUE:
        return Insert()
    if policy is OnActive.MERGE:
        newest = max(alive, key=lambda run: run.seq)
        return Join(newest) if joinable(newest) and newest.kind == kind else Insert()
    if policy is OnActive.REJECT:
        first = alive[0]
        more = f" and {len(alive) - 1} more" if len(alive) > 1 else ""
        raise SubjectBusy(
            f"subject {limits.shown(first.subject)} in workspace {limits.shown(first.workspace)} "
            f"has an active run {first.id} ({first.kind}, {first.state}){more}: "
            "nothing was enqueued",
            first.id,
        )
    return Insert(interrupt=tuple(alive))


def debounce_window(value: object, what: str = "debounce") -> timedelta | None:
    """``None``, or a debounce window: longer than zero and at most a year and a day."""
    if value is None:
        return None
    return limits.duration(value, what, longest=limits.MAX_DELAY)


def debounced_due(
    due_at: datetime,
    enqueued_at: datetime,
    now: datetime,
    debounce: timedelta,
    longest: timedelta | None,
) -> datetime:
    """When a run enqueued at ``enqueued_at`` and due at ``due_at`` falls due after work
    arrived for it at ``now`` under a ``debounce`` window: ``now + debounce``, but no later
    than ``enqueued_at + longest`` (a stream of merges cannot hold it back for ever), and never
    earlier than it was due already (a merge never hurries a run)."""
    pushed = now + debounce
    if longest is not None:
        pushed = min(pushed, enqueued_at + longest)
    return max(due_at, pushed)


def inputs(run: AgentRun, signals: Sequence[Signal]) -> list[JsonObject]:
    """The inputs a run answers, given its ``signals`` in delivery order: its own payload (as
    it was enqueued, which a kind that ignores merging reads unchanged), then each merged
    enqueue's payload in the order they joined."""
    # A merge's signal always carries the new work's payload, a JSON object (only a merge may
    # deliver the reserved name: AgentRuns.signal refuses it).
    merged = [cast(JsonObject, kept.payload) for kept in signals if kept.name == MERGED]
    return [run.payload, *merged]


def check_merged(run: AgentRun, signals: Sequence[Signal], payload: JsonObject) -> None:
    """Refuse (:class:`InvalidPayload`) a merge whose inputs, ``payload`` joined to ``run``'s,
    would not fit one payload's limits together: a kind reads them as one value."""
    try:
        validate_payload({"inputs": [*inputs(run, signals), payload]})
    except InvalidPayload as error:
        raise InvalidPayload(
            f"merging into run {run.id} would make its inputs too large together ({error}): "
            "nothing was enqueued"
        ) from error


def reserved(name: str) -> bool:
    """Whether a signal's ``name`` is one agentruns keeps for itself (a merge's)."""
    return name.startswith(RESERVED_PREFIX)
