"""Enqueue keys: which run a key still names, and whether a second enqueue asks for the same run.

An enqueue with a key (``AgentRuns.enqueue(..., key=...)``) finds the run the key names in its
workspace if the key is still *held*, and makes a new run otherwise (ADRs/0024):

- a key is held while its run has not ended (queued or leased), and for the kind's
  ``key_retention`` after the run ended (24 hours unless the kind says otherwise);
- a key whose run ended longer ago than that, or whose run was purged, names nothing: the next
  enqueue with it makes a new run, and the key names that one from then on.

A held key found by an enqueue of another kind, subject or payload is a
:class:`~agentruns.domain.errors.KeyConflict` naming the run: a key names one piece of work.
The band, due time and deadline of the second enqueue are not compared: the run already has its
own, and the second enqueue gets it as it is.

Pure: the store hands in the run and its own ``now``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from agentruns.domain import limits
from agentruns.domain.errors import KeyConflict
from agentruns.domain.payload import JsonObject
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState

DEFAULT_KEY_RETENTION = timedelta(hours=24)
# A key is held at most as long as a purge may keep an ended run.
MAX_KEY_RETENTION = limits.MAX_RETENTION


def key(value: object) -> str:
    """An enqueue key: a name (1 to 512 characters, not only blanks, no NUL)."""
    return limits.name(value, "an enqueue key")


def retention(value: object) -> timedelta:
    """How long a key stays held after its run ended: zero (only while it runs) up to
    :data:`MAX_KEY_RETENTION`."""
    return limits.duration(value, "a key's retention", longest=MAX_KEY_RETENTION, zero=True)


def held(run: AgentRun | None, now: datetime, kept_for: timedelta) -> bool:
    """Whether the key that names ``run`` still holds: the run exists and has not ended, or
    ended less than ``kept_for`` before ``now``."""
    if run is None:
        return False
    if run.state is not AgentRunState.ENDED or run.ended_at is None:
        return True
    return now < run.ended_at + kept_for


def check_same(
    run: AgentRun, *, name: str, kind: str, subject: str, payload: JsonObject
) -> AgentRun:
    """``run`` if an enqueue of ``kind`` on ``subject`` with ``payload`` under key ``name``
    asks for it, else :class:`~agentruns.domain.errors.KeyConflict` naming what differs."""
    differs = [
        what
        for what, same in (
            ("kind", run.kind == kind),
            ("subject", run.subject == subject),
            ("payload", run.payload == payload),
        )
        if not same
    ]
    if differs:
        raise KeyConflict(
            f"enqueue key {limits.shown(name)} in workspace {limits.shown(run.workspace)} "
            f"names run {run.id} ({run.kind} on {limits.shown(run.subject)}, {run.state}), "
            f"whose {' and '.join(differs)} differ: nothing was enqueued",
            run.id,
        )
    return run
