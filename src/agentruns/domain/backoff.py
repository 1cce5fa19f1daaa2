"""Exponential backoff with a cap and jitter from a random source the caller hands in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol


class RandomSource(Protocol):
    """What backoff needs of randomness: a float in [0, 1). ``random.Random`` fits."""

    def random(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """``base * multiplier ** (attempt - 1)``, capped, then spread by ``± jitter`` of itself.

    The jitter-free part never decreases with the attempt, and the result stays in [0, cap].
    """

    base: timedelta = timedelta(seconds=5)
    cap: timedelta = timedelta(minutes=10)
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.base < timedelta(0) or self.cap < timedelta(0):
            raise ValueError("backoff base and cap must not be negative")
        if self.multiplier < 1.0:
            raise ValueError("backoff multiplier must be at least 1")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("backoff jitter must be within [0, 1]")

    def base_delay(self, attempt: int) -> timedelta:
        """The delay before attempt ``attempt`` (1 for the first retry), without jitter."""
        exponent = max(attempt, 1) - 1
        cap = self.cap.total_seconds()
        seconds = self.base.total_seconds()
        # Multiply step by step so that large attempts saturate at the cap instead of
        # overflowing a float power.
        for _ in range(exponent):
            if seconds >= cap:
                break
            seconds *= self.multiplier
        return timedelta(seconds=min(seconds, cap))

    def delay(self, attempt: int, rng: RandomSource) -> timedelta:
        """The jittered delay before attempt ``attempt``: within [0, cap]."""
        base = self.base_delay(attempt).total_seconds()
        spread = base * self.jitter * (2.0 * rng.random() - 1.0)
        seconds = min(max(base + spread, 0.0), self.cap.total_seconds())
        return timedelta(seconds=seconds)

    def retry_delay(
        self, attempt: int, rng: RandomSource, retry_after: float | None = None
    ) -> timedelta:
        """The delay before a retry: the jittered backoff, or longer if the provider asked to
        wait (``retry_after`` seconds), never past the cap."""
        delay = self.delay(attempt, rng)
        if retry_after is None or retry_after <= 0:
            return delay
        asked = timedelta(seconds=min(retry_after, self.cap.total_seconds()))
        return max(delay, asked)
