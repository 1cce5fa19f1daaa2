"""What a run kind says about its runs' leases and retries (its handler lives in the app)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from agentruns.domain.backoff import Backoff

DEFAULT_RETRY_BUDGET = 3


@dataclass(frozen=True, slots=True)
class RunKindPolicy:
    """A kind's name, retry budget (requeues shared by failure retry and stale reclaim), lease
    length, backoff and the longest a run may live from its enqueue (``None``: no deadline)."""

    name: str
    retry_budget: int = DEFAULT_RETRY_BUDGET
    lease: timedelta = timedelta(seconds=30)
    backoff: Backoff = field(default_factory=Backoff)
    deadline: timedelta | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ValueError("a run kind needs a name")
        if self.retry_budget < 0:
            raise ValueError("a retry budget cannot be negative")
        if self.lease <= timedelta(0):
            raise ValueError("a lease must be longer than zero")
