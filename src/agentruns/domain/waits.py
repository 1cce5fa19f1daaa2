"""Durable waits and sleeps: a signal, the recorded step a wait resolves into, and the waking of
a waiting run (ADRs/0025).

A run that waits is a QUEUED run that is not due: its ``due_at`` is the wait's end (its timeout,
or the sleep's end), and ``waiting_for`` / ``waiting_until`` say what it waits for (``None`` for
a sleep) and until when. It stays its subject's head, so the subject's later runs wait behind it,
and the claim, the lanes and the reaper treat it as any queued run that is not due yet.

A wait resolves into a recorded step (:mod:`agentruns.domain.recorded_steps`) named
``wait:<name>`` (a sleep: ``sleep``), whose result is the signal (``{"signal_id", "payload"}``)
or ``{"timed_out": true}`` (a sleep: ``{"slept": true}``), so a later replay returns the same
answer without reading signals again. The k-th wait for a name in a run takes the k-th signal of
that name delivered to the run, in delivery order: a signal delivered before its wait is kept
for it, and two waits for one name never take the same signal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from uuid import UUID

from agentruns.domain.payload import JsonObject, JsonValue
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState

# The name of the recorded step a sleep resolves into.
SLEEP_STEP = "sleep"
_WAIT_PREFIX = "wait:"


@dataclass(frozen=True, slots=True)
class Signal:
    """A signal delivered to a run: its name, its id (the caller's, or one made at delivery),
    its JSON payload, and when it was delivered. ``seq`` is the delivery order in the store."""

    run_id: UUID
    name: str
    signal_id: str
    payload: JsonValue = field(compare=False)
    delivered_at: datetime
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Delivered:
    """What :meth:`~agentruns.AgentRuns.signal` did: the signal kept, and whether this delivery
    kept it (``created`` is False for a delivery whose ``signal_id`` was delivered before:
    nothing was written, and the first delivery's signal is the answer)."""

    signal: Signal
    created: bool


def wait_step(name: str) -> str:
    """The recorded step a wait for the signal ``name`` resolves into."""
    return f"{_WAIT_PREFIX}{name}"


def signalled(signal: Signal) -> JsonObject:
    """The recorded result of a wait that got ``signal``."""
    return {"signal_id": signal.signal_id, "payload": signal.payload}


TIMED_OUT: JsonObject = {"timed_out": True}
SLEPT: JsonObject = {"slept": True}


def is_waiting(run: AgentRun) -> bool:
    """Whether ``run`` is waiting (for a signal, or asleep): queued, with a wait's end set."""
    return run.state is AgentRunState.QUEUED and run.waiting_until is not None


def same_wait(run: AgentRun, name: str | None) -> bool:
    """Whether ``run`` (being resumed) waited for ``name`` (``None``: a sleep) before its claim:
    then its wait keeps the end it had, and a passed end is the wait's timeout."""
    return run.waiting_until is not None and run.waiting_for == name


def wake(run: AgentRun, *, name: str, now: datetime) -> AgentRun | None:
    """The waiting run after a signal ``name`` arrived: due now, no longer waiting; ``None`` when
    the run does not wait for that signal (it runs, sleeps, waits for another, or is not due
    to wait yet: the signal is kept for its wait)."""
    if run.state is not AgentRunState.QUEUED or run.waiting_until is None:
        return None
    if run.waiting_for != name:
        return None
    return replace(
        run, due_at=min(run.due_at, now), waiting_for=None, waiting_until=None, waiting_since=None
    )
