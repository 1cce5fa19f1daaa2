"""Failure classes: which failures a retry may fix.

A host's provider adapters raise (or map their errors to) :class:`ProviderError`; the classifier
also knows the standard library's timeouts and connection errors, walks ``__cause__`` chains to
the first error it knows, and judges a :class:`FallbackChainExhausted` by its most recent attempt.

Errors of model SDKs are read by their shape, not their package (docs/failures.md): an HTTP
status on the exception (``status_code``, ``status``, ``http_status``, ``response.status_code``,
or an :class:`http.HTTPStatus` ``code``) classifies as :func:`classify_status` says; an exception
without a status whose class (or a base class) is named like a timeout or a connection error is
TIMEOUT or CONNECTION; a ``retry_after`` attribute or a ``retry-after``/``retry-after-ms``
response header says how long the provider asked to wait. A kind that knows better declares its
own classifier (:data:`KindClassifier`), asked first.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from http import HTTPStatus


class FailureClass(enum.StrEnum):
    AUTH = "auth"
    CONFIGURATION = "configuration"
    CLIENT_ERROR = "client_error"
    RATE_LIMITED = "rate_limited"
    SERVER_ERROR = "server_error"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    # Recorded by the reaper when it takes back an expired lease: the holder died or stalled.
    LEASE_EXPIRED = "lease_expired"
    # Recorded by a holder that leased a run of a kind it has not registered: nothing ran, and a
    # process that registers the kind can run it (not a step's error: the classifier never
    # answers it for one).
    UNKNOWN_KIND = "unknown_kind"
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


_STATUS_ATTRIBUTES = ("status_code", "status", "http_status")


def _http_status(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return int(value) if 100 <= value <= 599 else None


def status_of(error: BaseException) -> int | None:
    """The HTTP status an exception carries, as model SDKs and HTTP clients put it: an attribute
    ``status_code``, ``status`` or ``http_status``, the same on its ``response``, or an
    :class:`http.HTTPStatus` ``code``. ``None`` when it carries none."""
    for owner in (error, getattr(error, "response", None)):
        if owner is None:
            continue
        for name in _STATUS_ATTRIBUTES:
            found = _http_status(getattr(owner, name, None))
            if found is not None:
                return found
    code = getattr(error, "code", None)
    return int(code) if isinstance(code, HTTPStatus) else None


def _named_like(error: BaseException, *fragments: str) -> bool:
    return any(fragment in cls.__name__ for cls in type(error).__mro__ for fragment in fragments)


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
    carried = status_of(error)
    if carried is not None:
        return classify_status(carried)
    # SDKs raise their own timeout and connection errors (no status: no answer came back).
    if _named_like(error, "Timeout", "TimedOut"):
        return FailureClass.TIMEOUT
    if _named_like(error, "ConnectionError", "ConnectError", "APIConnection"):
        return FailureClass.CONNECTION
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


def _seconds(value: object, now: datetime | None = None) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = float(value.strip())
        except ValueError:
            return _until(value, now)
    else:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _until(value: str, now: datetime | None) -> float | None:
    """An HTTP date's wait from ``now`` (zero once past); ``None`` without a ``now`` (the domain
    reads no clock: the caller passes its own) or for text that is no date."""
    if now is None:
        return None
    try:
        at = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)  # RFC 9110: an HTTP date is in GMT
    return max(0.0, (at - now).total_seconds())


def retry_after_of(error: BaseException, now: datetime | None = None) -> float | None:
    """How many seconds the provider asked to wait: a ``retry_after`` attribute (seconds), else
    the ``retry-after-ms`` or ``retry-after`` header of the error's ``response``, walking the
    cause chain (and a fallback chain's most recent attempt). A ``Retry-After`` that is an HTTP
    date counts from ``now`` (without one it says nothing). ``None`` when none says."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, FallbackChainExhausted):
            return retry_after_of(current.attempts[-1], now) if current.attempts else None
        found = _seconds(getattr(current, "retry_after", None), now)
        if found is not None:
            return found
        headers = getattr(getattr(current, "response", None), "headers", None)
        if isinstance(headers, Mapping) or hasattr(headers, "get"):
            millis = _seconds(_header(headers, "retry-after-ms"))
            if millis is not None:
                return millis / 1000
            found = _seconds(_header(headers, "retry-after"), now)
            if found is not None:
                return found
        current = current.__cause__
    return None


def _header(headers: object, name: str) -> object:
    getter = getattr(headers, "get", None)
    if getter is None:
        return None
    try:
        value = getter(name)
        if value is None:
            value = getter(name.title())
    except Exception:  # a header object of an unknown shape says nothing
        return None
    return value


@dataclass(frozen=True, slots=True)
class ClassifiedFailure:
    """What a failure is: its class, and how long the provider asked to wait (seconds)."""

    failure_class: FailureClass
    retry_after: float | None = None


KindClassifier = Callable[[BaseException], "FailureClass | ClassifiedFailure | None"]
"""A kind's own classifier: the class of an error it knows, or ``None`` to leave the error to
the default rules (:func:`classify`)."""


def classify_failure(
    error: BaseException, custom: KindClassifier | None = None, now: datetime | None = None
) -> ClassifiedFailure:
    """The kind's classifier first (if it answers), else :func:`classify`; the retry-after the
    error carries (an HTTP date counted from ``now``), unless the kind's answer names one."""
    retry_after = retry_after_of(error, now)
    if custom is not None:
        answer = custom(error)
        if isinstance(answer, ClassifiedFailure):
            if answer.retry_after is None and retry_after is not None:
                return ClassifiedFailure(answer.failure_class, retry_after)
            return answer
        if isinstance(answer, FailureClass):
            return ClassifiedFailure(answer, retry_after)
    return ClassifiedFailure(classify(error), retry_after)
