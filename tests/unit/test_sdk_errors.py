"""Errors of model SDKs and HTTP clients classify by their shape (docs/failures.md).

The stand-ins below carry what the real exceptions carry: ``status_code`` and a ``response`` with
headers (OpenAI's and Anthropic's ``APIStatusError``), a ``response.status_code``
(``httpx.HTTPStatusError``), ``status`` (aiohttp's ``ClientResponseError``), an
``http.HTTPStatus`` ``code`` (Google's ``GoogleAPICallError``), and timeout and connection
errors without a status (``APITimeoutError``, ``httpx.ConnectTimeout``, ``APIConnectionError``).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from pathlib import Path

import pytest

from agentruns.app.kinds import RunKind
from agentruns.domain.backoff import Backoff
from agentruns.domain.failures import (
    ClassifiedFailure,
    FailureClass,
    FallbackChainExhausted,
    ProviderError,
    classify,
    classify_failure,
    retry_after_of,
    status_of,
)

F = FailureClass


class Response:
    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status_code
        self.headers = headers or {}


class APIError(Exception):
    """Like ``openai.APIError``/``anthropic.APIError``: the base of everything the SDK raises."""


class APIStatusError(APIError):
    def __init__(self, message: str, status_code: int, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.response = Response(status_code, headers)


class RateLimitError(APIStatusError):
    pass


class APIConnectionError(APIError):
    pass


class APITimeoutError(APIConnectionError):
    pass


class HTTPStatusError(Exception):
    """Like ``httpx.HTTPStatusError``: the status is on the response only."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.response = Response(status_code)


class ConnectTimeout(Exception):
    """Like ``httpx.ConnectTimeout`` (a ``TransportError``, not a builtin TimeoutError)."""


class ClientResponseError(Exception):
    """Like ``aiohttp.ClientResponseError``: ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(f"{status}")
        self.status = status


class GoogleAPICallError(Exception):
    """Like ``google.api_core.exceptions.GoogleAPICallError``: an HTTPStatus ``code``."""

    def __init__(self, code: HTTPStatus) -> None:
        super().__init__(code.phrase)
        self.code = code


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (APIStatusError("bad request", 400), F.CLIENT_ERROR),
        (APIStatusError("invalid key", 401), F.AUTH),
        (APIStatusError("no access", 403), F.AUTH),
        (RateLimitError("slow down", 429), F.RATE_LIMITED),
        (APIStatusError("overloaded", 529), F.SERVER_ERROR),
        (APIStatusError("internal", 500), F.SERVER_ERROR),
        (HTTPStatusError("upstream", 502), F.SERVER_ERROR),
        (HTTPStatusError("gone", 404), F.CLIENT_ERROR),
        (ClientResponseError(503), F.SERVER_ERROR),
        (GoogleAPICallError(HTTPStatus.TOO_MANY_REQUESTS), F.RATE_LIMITED),
        (GoogleAPICallError(HTTPStatus.UNAUTHORIZED), F.AUTH),
        (APITimeoutError("request timed out"), F.TIMEOUT),
        (ConnectTimeout("connect timed out"), F.TIMEOUT),
        (APIConnectionError("connection error"), F.CONNECTION),
    ],
)
def test_sdk_errors_classify_by_the_status_they_carry_or_their_name(
    error: Exception, expected: FailureClass
) -> None:
    """A status on the exception (or its response) decides; without one, a timeout or connection
    error's name does."""
    assert classify(error) is expected


def test_a_status_that_is_not_http_is_not_read_as_one() -> None:
    """An attribute named like a status that holds no HTTP status says nothing."""

    class Odd(Exception):
        status = "pending"
        status_code = True
        code = 42

    assert status_of(Odd()) is None
    assert classify(Odd()) is F.UNKNOWN


def test_an_sdk_error_wrapped_by_the_host_is_found_through_its_cause() -> None:
    wrapped = RuntimeError("summarising failed")
    wrapped.__cause__ = RateLimitError("slow down", 429, {"retry-after": "7"})
    assert classify(wrapped) is F.RATE_LIMITED
    assert retry_after_of(wrapped) == 7.0


@pytest.mark.parametrize(
    ("error", "seconds"),
    [
        (RateLimitError("slow down", 429, {"retry-after": "12"}), 12.0),
        (RateLimitError("slow down", 429, {"Retry-After": "3.5"}), 3.5),
        (RateLimitError("slow down", 429, {"retry-after-ms": "250"}), 0.25),
        (ProviderError("slow down", status=429, retry_after=30.0), 30.0),
        (RateLimitError("slow down", 429, {"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}), None),
        (RateLimitError("slow down", 429), None),
        (RuntimeError("no hint"), None),
    ],
)
def test_retry_after_is_read_from_the_attribute_or_the_response_headers(
    error: Exception, seconds: float | None
) -> None:
    """Seconds or milliseconds; an HTTP date is left alone without a ``now`` (the domain reads
    no clock)."""
    assert retry_after_of(error) == seconds


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("Wed, 21 Oct 2026 07:28:00 GMT", 30.0),
        ("Wed, 21 Oct 2026 07:27:00 GMT", 0.0),  # already past: no wait
        ("Wed, 21 Oct 2026 07:28:00 +0100", 0.0),  # an hour earlier in UTC
        ("next tuesday", None),
    ],
)
def test_an_http_date_retry_after_counts_from_the_now_it_is_given(
    header: str, seconds: float | None
) -> None:
    now = datetime(2026, 10, 21, 7, 27, 30, tzinfo=UTC)
    error = RateLimitError("slow down", 429, {"retry-after": header})
    assert retry_after_of(error, now) == seconds
    assert classify_failure(error, now=now).retry_after == seconds


def test_retry_after_of_a_fallback_chain_is_its_most_recent_attempts() -> None:
    latest = RateLimitError("b", 429, {"retry-after": "4"})
    chain = FallbackChainExhausted([ProviderError("a", status=429, retry_after=99), latest])
    assert retry_after_of(chain) == 4.0


def test_the_retry_waits_at_least_what_the_provider_asked_but_never_past_the_cap() -> None:
    backoff = Backoff(base=timedelta(seconds=1), cap=timedelta(seconds=60), jitter=0.0)
    rng = random.Random(1)
    assert backoff.retry_delay(1, rng) == timedelta(seconds=1)
    assert backoff.retry_delay(1, rng, retry_after=20) == timedelta(seconds=20)
    assert backoff.retry_delay(1, rng, retry_after=0.5) == timedelta(seconds=1)
    assert backoff.retry_delay(1, rng, retry_after=3600) == timedelta(seconds=60)


class QuotaExceeded(Exception):
    """A provider's own error that the default rules cannot know: a billing quota."""


def test_a_kinds_classifier_is_asked_first_and_may_leave_an_error_to_the_defaults() -> None:
    def classifier(error: BaseException) -> FailureClass | None:
        if isinstance(error, QuotaExceeded):
            return F.CONFIGURATION  # no retry fixes an empty account
        if isinstance(error, APIStatusError) and error.status_code == 529:
            return ClassifiedFailure(F.RATE_LIMITED, retry_after=60)
        return None

    assert classify_failure(QuotaExceeded("out of credit"), classifier) == ClassifiedFailure(
        F.CONFIGURATION
    )
    assert classify_failure(APIStatusError("overloaded", 529), classifier) == ClassifiedFailure(
        F.RATE_LIMITED, 60
    )
    asked = RateLimitError("slow", 429, {"retry-after": "5"})
    assert classify_failure(asked, classifier) == ClassifiedFailure(F.RATE_LIMITED, 5.0)
    assert classify_failure(QuotaExceeded("out of credit")) == ClassifiedFailure(F.UNKNOWN)


def test_the_documented_kind_classifier_works_as_the_page_says() -> None:
    """docs/failures.md's example, executed: a quota is final, a 529 waits 30 s, the rest are
    left to the defaults."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "failures.md").read_text()
    source = page.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(source, "docs/failures.md", "exec"), namespace)
    kind = namespace["SUMMARISE"]
    assert isinstance(kind, RunKind)
    quota = namespace["QuotaExceeded"]
    assert isinstance(quota, type)
    assert kind.classify(quota("spent")) == ClassifiedFailure(F.CONFIGURATION)
    assert kind.classify(APIStatusError("overloaded", 529)) == ClassifiedFailure(
        F.RATE_LIMITED, 30.0
    )
    assert kind.classify(RateLimitError("slow", 429, {"retry-after": "2"})) == ClassifiedFailure(
        F.RATE_LIMITED, 2.0
    )
