"""What a run kind says about its runs' leases and retries (its handler lives in the app)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from agentruns.domain import limits
from agentruns.domain.backoff import Backoff
from agentruns.domain.errors import InvalidRequest
from agentruns.domain.keys import DEFAULT_KEY_RETENTION, retention
from agentruns.domain.subject_policy import OnActive, debounce_window

DEFAULT_RETRY_BUDGET = 3
# Attempts are PostgreSQL integers; a budget beyond this many requeues is a mistake.
MAX_RETRY_BUDGET = 1_000_000


@dataclass(frozen=True, slots=True)
class RunKindPolicy:
    """A kind's name, retry budget (requeues shared by failure retry and stale reclaim), lease
    length, backoff, the longest a run may live from its enqueue (``None``: no deadline) and the
    longest one step may run (``None``: no bound) before the worker cancels it.

    The lease is longer than zero and at most a day, the deadline longer than zero and at most
    366 days, the backoff's cap at most 366 days, the step timeout longer than zero and at most
    a day (:mod:`agentruns.domain.limits`). The step timeout is the holder process's own time,
    as the shutdown grace is: a manual clock does not move it (ADRs/0022).

    ``key_retention`` is how long an enqueue key stays held after its run ended (zero: only
    while the run has not ended; at most a century): an enqueue with the same key finds the
    ended run until then, and makes a new run after (:mod:`agentruns.domain.keys`).

    ``on_active`` is what an enqueue that names no policy does when its subject has a run that
    has not ended: queue behind it (the default), reject, interrupt it, or merge into its
    newest run if that was never claimed (:mod:`agentruns.domain.subject_policy`).
    ``debounce`` is a merge's default window (``None``: none): a run that new work joins, or
    that a merge makes, is not claimed until that long after the last work arrived, and no
    later than ``debounce_max_wait`` after its first (``None``: no bound) (ADRs/0031).

    ``limits`` names the provider limits its runs draw from (ADRs/0032): a worker does not claim
    a run of the kind while one of them is empty or paused (no attempt is spent), and a 429 or
    503 with a Retry-After from one of its steps pauses them all for every worker."""

    name: str
    retry_budget: int = DEFAULT_RETRY_BUDGET
    lease: timedelta = timedelta(seconds=30)
    backoff: Backoff = field(default_factory=Backoff)
    deadline: timedelta | None = None
    step_timeout: timedelta | None = None
    key_retention: timedelta = DEFAULT_KEY_RETENTION
    on_active: OnActive = OnActive.QUEUE
    debounce: timedelta | None = None
    debounce_max_wait: timedelta | None = None
    limits: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # InvalidRequest is a ValueError: a bad policy fails where the host builds it.
        limits.name(self.name, "a run kind's name")
        if not isinstance(self.retry_budget, int) or isinstance(self.retry_budget, bool):
            raise InvalidRequest("a retry budget is an integer")
        if not 0 <= self.retry_budget <= MAX_RETRY_BUDGET:
            raise InvalidRequest(f"a retry budget is from 0 to {MAX_RETRY_BUDGET}")
        limits.duration(self.lease, "a lease", longest=limits.MAX_LEASE)
        if self.deadline is not None:
            limits.duration(self.deadline, "a deadline", longest=limits.MAX_DEADLINE)
        if self.step_timeout is not None:
            limits.duration(self.step_timeout, "a step timeout", longest=limits.MAX_LEASE)
        retention(self.key_retention)
        OnActive.parse(self.on_active)
        debounce_window(self.debounce, "a kind's debounce")
        debounce_window(self.debounce_max_wait, "a kind's debounce_max_wait")
        if not isinstance(self.limits, tuple):
            raise InvalidRequest("a kind's limits are a tuple of limit names")
        for limit in self.limits:
            limits.name(limit, "a kind's limit")
        if self.backoff.cap > limits.MAX_DELAY:
            raise InvalidRequest(f"a backoff's cap is at most {limits.MAX_DELAY}")
