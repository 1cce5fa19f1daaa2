"""The failure classifier: which failures a retry may fix."""

from __future__ import annotations

import pytest

from agentruns.domain.failures import (
    ConfigurationError,
    FailureClass,
    FallbackChainExhausted,
    ProviderError,
    classify,
)

F = FailureClass


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, F.CLIENT_ERROR),
        (401, F.AUTH),
        (403, F.AUTH),
        (404, F.CLIENT_ERROR),
        (408, F.TIMEOUT),
        (422, F.CLIENT_ERROR),
        (429, F.RATE_LIMITED),
        (500, F.SERVER_ERROR),
        (502, F.SERVER_ERROR),
        (503, F.SERVER_ERROR),
        (504, F.SERVER_ERROR),
        (302, F.UNKNOWN),
    ],
)
def test_a_provider_status_maps_to_its_class(status: int, expected: FailureClass) -> None:
    """HTTP statuses classify as the table says: auth and 4xx final, 408/429/5xx retryable."""
    assert classify(ProviderError("boom", status=status)) is expected


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (TimeoutError("slow"), F.TIMEOUT),
        (ConnectionResetError("reset"), F.CONNECTION),
        (ConnectionRefusedError("refused"), F.CONNECTION),
        (ConfigurationError("no api key"), F.CONFIGURATION),
        (ProviderError("no status"), F.UNKNOWN),
        (RuntimeError("what"), F.UNKNOWN),
    ],
)
def test_standard_failures_map_to_their_class(error: Exception, expected: FailureClass) -> None:
    """Timeouts, connection errors and configuration errors are known without a status."""
    assert classify(error) is expected


@pytest.mark.parametrize(
    ("failure", "retryable"),
    [
        (F.AUTH, False),
        (F.CONFIGURATION, False),
        (F.CLIENT_ERROR, False),
        (F.RATE_LIMITED, True),
        (F.SERVER_ERROR, True),
        (F.TIMEOUT, True),
        (F.CONNECTION, True),
        (F.LEASE_EXPIRED, True),
        (F.UNKNOWN, True),
    ],
)
def test_only_auth_configuration_and_client_errors_are_final(
    failure: FailureClass, retryable: bool
) -> None:
    """Unknown failures are retryable: the retry budget bounds them."""
    assert failure.is_retryable is retryable


def test_a_fallback_chain_classifies_by_its_most_recent_attempt() -> None:
    """A chain that ended on a 401 is auth, even if it began with a 503."""
    chain = FallbackChainExhausted([ProviderError("a", status=503), ProviderError("b", status=401)])
    assert classify(chain) is F.AUTH
    reversed_chain = FallbackChainExhausted(
        [ProviderError("b", status=401), ProviderError("a", status=503)]
    )
    assert classify(reversed_chain) is F.SERVER_ERROR


def test_nested_fallback_chains_classify_by_the_innermost_most_recent_attempt() -> None:
    """A chain whose last attempt is itself a chain is judged by that chain's last attempt."""
    inner = FallbackChainExhausted([ProviderError("x", status=500), ProviderError("y", status=429)])
    outer = FallbackChainExhausted([ProviderError("z", status=401), inner])
    assert classify(outer) is F.RATE_LIMITED


def test_an_empty_fallback_chain_is_unknown() -> None:
    assert classify(FallbackChainExhausted([])) is F.UNKNOWN


def test_the_cause_chain_is_walked_to_a_known_error() -> None:
    """A host's wrapper exception is classified by the known error it was raised from."""
    outer = RuntimeError("step failed")
    middle = ValueError("while calling the provider")
    middle.__cause__ = ProviderError("denied", status=403)
    outer.__cause__ = middle
    assert classify(outer) is F.AUTH


def test_a_cyclic_cause_chain_ends_as_unknown() -> None:
    first = RuntimeError("a")
    second = RuntimeError("b")
    first.__cause__ = second
    second.__cause__ = first
    assert classify(first) is F.UNKNOWN
