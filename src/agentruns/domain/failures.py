"""Failure classes: which failures a retry may fix.

A host's provider adapters raise (or map their errors to) :class:`ProviderError`; the classifier
also knows the standard library's timeouts and connection errors, walks ``__cause__`` chains to
the first error it knows, and judges a :class:`FallbackChainExhausted` by its most recent attempt.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence


class FailureClass(enum.StrEnum):
    AUTH = "auth"
    CONFIGURATION = "configuration"
    CLIENT_ERROR = "client_error"
    RATE_LIMITED = "rate_limited"
    SERVER_ERROR = "server_error"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    UNKNOWN = "unknown"

    @property
    def is_retryable(self) -> bool:
        return self not in _NOT_RETRYABLE


_NOT_RETRYABLE = frozenset(
    {FailureClass.AUTH, FailureClass.CONFIGURATION, FailureClass.CLIENT_ERROR}
)


class ProviderError(Exception):
    """A provider-neutral failure of a call a step made: an HTTP status, a code, a retry hint."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


class ConfigurationError(Exception):
    """A step cannot run as configured (missing key, unknown model): retrying will not help."""


class FallbackChainExhausted(Exception):
    """Every provider in a fallback chain failed; ``attempts`` holds their failures in order."""

    def __init__(self, attempts: Sequence[BaseException]) -> None:
        super().__init__(f"fallback chain exhausted after {len(attempts)} attempt(s)")
        self.attempts = tuple(attempts)


_STATUS_CLASSES: dict[int, FailureClass] = {
    401: FailureClass.AUTH,
    403: FailureClass.AUTH,
    407: FailureClass.AUTH,
    408: FailureClass.TIMEOUT,
    429: FailureClass.RATE_LIMITED,
}


def classify_status(status: int) -> FailureClass:
    """The class of an HTTP status: 401/403 auth, 408 timeout, 429 rate limit, other 4xx client
    error, 5xx server error, anything else unknown."""
    known = _STATUS_CLASSES.get(status)
    if known is not None:
        return known
    if 400 <= status < 500:
        return FailureClass.CLIENT_ERROR
    if 500 <= status < 600:
        return FailureClass.SERVER_ERROR
    return FailureClass.UNKNOWN


def _classify_one(error: BaseException) -> FailureClass:
    match error:
        case FallbackChainExhausted(attempts=attempts):
            return classify(attempts[-1]) if attempts else FailureClass.UNKNOWN
        case ProviderError(status=int(status)):
            return classify_status(status)
        case ConfigurationError():
            return FailureClass.CONFIGURATION
        case TimeoutError():
            return FailureClass.TIMEOUT
        case ConnectionError():
            return FailureClass.CONNECTION
        case _:
            return FailureClass.UNKNOWN


def classify(error: BaseException) -> FailureClass:
    """Classify a failure, walking ``__cause__`` until an error of a known class is found.

    A cycle in the cause chain ends the walk; an error with no known class anywhere in its
    chain is UNKNOWN (retryable: the retry budget bounds it).
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _classify_one(current)
        if found is not FailureClass.UNKNOWN:
            return found
        if isinstance(current, FallbackChainExhausted):
            return found
        current = current.__cause__
    return FailureClass.UNKNOWN
