"""What a failed attempt leaves on its run: type, message and traceback, bounded and redacted."""

from __future__ import annotations

from agentruns.domain.errors import StepTimedOut
from agentruns.domain.failure_records import (
    MAX_MESSAGE,
    MAX_TRACEBACK,
    describe_failure,
    error_type_name,
)
from agentruns.domain.failures import FailureClass, ProviderError
from agentruns.domain.redaction import PAYLOAD, REDACTED, redact_text


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def _chained(depth: int) -> None:
    """``depth`` errors, each raised from the one before, each with a long message."""
    if depth == 0:
        raise ValueError("at the bottom")
    try:
        _chained(depth - 1)
    except ValueError as error:
        raise ValueError(f"layer {depth} " + "-" * 200) from error


def test_the_detail_names_the_type_the_message_and_the_frames() -> None:
    error = _raised(KeyError("missing-field"))
    detail = describe_failure(error, FailureClass.UNKNOWN)
    assert detail.error_type == "KeyError"
    assert detail.message == "'missing-field'"
    assert detail.failure_class is FailureClass.UNKNOWN
    assert detail.traceback.startswith("Traceback (most recent call last):")
    assert "in _raised" in detail.traceback
    assert detail.traceback.rstrip().endswith("KeyError: 'missing-field'")


class HostError(Exception):
    """A host's own exception, defined where the host defines it."""

    class Nested(Exception):
        pass


def test_an_exported_error_is_named_by_its_public_name() -> None:
    """A failure names ``agentruns.ProviderError``, not the module it lives in, which may move."""
    assert error_type_name(ProviderError("x")) == "agentruns.ProviderError"
    assert error_type_name(StepTimedOut("step ran past 1s")) == "agentruns.StepTimedOut"
    assert error_type_name(TimeoutError()) == "TimeoutError"


def test_a_host_error_is_named_by_its_module_and_qualified_name() -> None:
    assert error_type_name(HostError()) == f"{__name__}.HostError"
    assert error_type_name(HostError.Nested()) == f"{__name__}.HostError.Nested"


def test_an_unexported_agentruns_class_keeps_its_module() -> None:
    """Only a name that ``agentruns.__all__`` exports, and that is the same class, is shortened."""

    class ProviderError(Exception):  # the public name, but not the public class
        pass

    ProviderError.__module__ = "agentruns.domain.failures"
    ProviderError.__qualname__ = "ProviderError"
    assert error_type_name(ProviderError()) == "agentruns.domain.failures.ProviderError"


def test_the_payload_is_not_echoed_in_the_message_or_the_traceback() -> None:
    """A step that puts its input in its error (a common habit) leaves no trace of it."""
    payload = {"document": "the quarterly numbers", "nested": {"notes": ["confidential memo"]}}
    error = _raised(ValueError(f"cannot summarise {payload['document']!r}: confidential memo"))
    detail = describe_failure(error, FailureClass.UNKNOWN, payload)
    for text in (detail.message, detail.traceback):
        assert "quarterly numbers" not in text
        assert "confidential memo" not in text
        assert PAYLOAD in text


def test_credentials_are_redacted() -> None:
    text = (
        "POST https://user:s3cr3t@api.example/v1 failed; Authorization: Bearer abcdefghijklmnop; "
        "api_key=sk-proj-ABCDEFGHIJKLMNOPQRST password='hunter2' token: tkn123456 "
        "sk-ant-api03-ABCDEFGHIJKLMNOP"
    )
    cleaned = redact_text(text)
    for secret in ("s3cr3t", "abcdefghijklmnop", "ABCDEFGHIJKLMNOPQRST", "hunter2", "tkn123456"):
        assert secret not in cleaned
    assert "sk-ant-api03" not in cleaned
    assert cleaned.count(REDACTED) >= 5
    assert "https://user:" in cleaned  # where the secret was stays readable


def test_the_message_and_the_traceback_are_capped() -> None:
    detail = describe_failure(_raised(RuntimeError("x" * 50_000)), FailureClass.UNKNOWN)
    assert len(detail.message) <= MAX_MESSAGE
    try:
        _chained(60)
    except ValueError as error:
        deep = describe_failure(error, FailureClass.UNKNOWN)
    assert len(deep.traceback) <= MAX_TRACEBACK + 100
    assert deep.traceback.startswith("Traceback (most recent call last):")
    assert "characters omitted" in deep.traceback
    assert deep.traceback.rstrip().endswith("ValueError: layer 60 " + "-" * 200)


def test_a_cause_chain_is_in_the_traceback() -> None:
    try:
        try:
            raise ProviderError("denied", status=403)
        except ProviderError as inner:
            raise RuntimeError("step failed") from inner
    except RuntimeError as outer:
        detail = describe_failure(outer, FailureClass.AUTH)
    assert "ProviderError: denied" in detail.traceback
    assert "direct cause" in detail.traceback
    assert detail.error_type == "RuntimeError"
