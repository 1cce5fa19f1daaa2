"""What every contender shares: the measurement record and the drain clock."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Measurement:
    """One drain: ``jobs`` finished in ``seconds``."""

    contender: str
    jobs: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Series:
    """Repeated drains of one contender at one setting."""

    contender: str
    family: str
    setting: str
    rates: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def low(self) -> float:
        return min(self.rates) if self.rates else 0.0

    @property
    def high(self) -> float:
        return max(self.rates) if self.rates else 0.0


async def timed(drain: Callable[[], Awaitable[int]]) -> tuple[int, float]:
    """Run ``drain`` (which returns how many jobs it finished) on the wall clock."""
    started = time.perf_counter()
    done = await drain()
    return done, time.perf_counter() - started
