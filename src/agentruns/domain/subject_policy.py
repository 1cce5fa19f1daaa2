"""What an enqueue does when its subject already has an active run (ADRs/0028).

A subject's *active* runs are those that have not ended: its leased run, and its queued runs
(waiting ones included). An enqueue chooses a policy (``on_active=``), or takes its kind's
(``RunKindPolicy.on_active``, ``queue`` unless the kind says otherwise):

- ``queue``: the new run is queued behind the active ones (the subject's FIFO);
- ``reject``: nothing is written, and :class:`SubjectBusy` names the active run;
- ``interrupt``: every active run is ended ``cancelled`` (a leased one's holder is told, and its
  running step is cancelled: ADRs/0023), and the new run is the subject's next, in one
  transaction.

Pure: the store hands in the subject's active runs, read under the subject's lock.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from agentruns.domain import limits
from agentruns.domain.errors import InvalidRequest, SubjectBusy
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState


class OnActive(enum.StrEnum):
    """What an enqueue does when its subject has a run that has not ended."""

    QUEUE = "queue"
    REJECT = "reject"
    INTERRUPT = "interrupt"

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


def active(runs: Sequence[AgentRun]) -> list[AgentRun]:
    """The runs of ``runs`` that have not ended, leased first, then in queue order."""
    alive = [run for run in runs if run.state is not AgentRunState.ENDED]
    return sorted(alive, key=lambda run: (run.state is not AgentRunState.LEASED, run.seq))


def decide(policy: OnActive, runs: Sequence[AgentRun]) -> Insert:
    """What an enqueue under ``policy`` does, given its subject's runs (ended ones are ignored):
    an :class:`Insert`, or :class:`SubjectBusy` (``reject`` on an active subject)."""
    alive = active(runs)
    if not alive or policy is OnActive.QUEUE:
        return Insert()
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
