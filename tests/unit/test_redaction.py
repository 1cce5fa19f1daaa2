"""One redaction rule for failures, events and payloads: by key name and by secret shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

from rich.console import Console

import agentruns
from agentruns.domain.failure_records import describe_failure
from agentruns.domain.failures import FailureClass, FallbackChainExhausted, ProviderError
from agentruns.domain.redaction import (
    PAYLOAD,
    REDACTED,
    PayloadEchoes,
    is_secret_key,
    redact_json,
    redact_text,
)
from agentruns.entrypoints.cli import render
from agentruns.testing import ManualClock, MemoryFamily


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def test_a_short_payload_value_is_not_cut_out_of_a_message() -> None:
    """The demo's ``{"fail": "chain"}`` left ``fallback [payload] exhausted``."""
    error = _raised(FallbackChainExhausted([ProviderError("overloaded", status=503)]))
    detail = describe_failure(error, FailureClass.SERVER_ERROR, {"fail": "chain", "lang": "en"})
    assert detail.message == "fallback chain exhausted after 1 attempt(s)"
    assert "FallbackChainExhausted: fallback chain exhausted" in detail.traceback


def test_a_payload_value_is_replaced_only_where_it_stands_whole() -> None:
    echoes = PayloadEchoes({"document": "quarterly"})
    assert echoes.redact("cannot read quarterly: gone") == f"cannot read {PAYLOAD}: gone"
    assert echoes.redact("the quarterlyReport field") == "the quarterlyReport field"


def test_a_secret_keyed_payload_value_is_redacted_from_failure_text_whatever_its_length() -> None:
    payload = {"model": "gpt-4o", "openai_api_key": "k3y-9z", "nested": [{"password": "hunter"}]}
    error = _raised(ValueError("login as k3y-9z with hunter refused for gpt-4o"))
    detail = describe_failure(error, FailureClass.AUTH, payload)
    assert detail.message == f"login as {REDACTED} with {REDACTED} refused for gpt-4o"


def test_event_data_is_redacted_by_key_name() -> None:
    data = {
        "api_key": "sk-proj-ABCDEFGHIJKLMNOPQRST",
        "apiKey": "plain",
        "X-Api-Key": "plain",
        "GITHUB_TOKEN": 12345,
        "headers": [{"Authorization": "Bearer abcdefghijklmnop"}],
        "credentials": {"user": "ops", "pass": "x"},
        "max_tokens": 1024,
        "tokens_used": 80,
        "model": "claude",
        "nothing": None,
        "password": None,
    }
    assert redact_json(data) == {
        "api_key": REDACTED,
        "apiKey": REDACTED,
        "X-Api-Key": REDACTED,
        "GITHUB_TOKEN": REDACTED,
        "headers": [{"Authorization": REDACTED}],
        "credentials": REDACTED,
        "max_tokens": 1024,
        "tokens_used": 80,
        "model": "claude",
        "nothing": None,
        "password": None,
    }


def test_a_payload_is_redacted_by_secret_shape_under_any_key() -> None:
    payload = {
        "note": "call with sk-ant-api03-ABCDEFGHIJKLMNOP please",
        "database": "postgres://app:s3cr3t@db/app",
        "header": "Bearer abcdefghijklmnop",
        "aws": "AKIAABCDEFGHIJKLMNOP",
        "gh": "ghp_ABCDEFGHIJKLMNOPQRSTUVWX",
        "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLXZhbHVl",
        "config": "retries=3 api_key=abc123 mode=fast",
        "plain": ["chain", "doc:1"],
    }
    assert redact_json(payload) == {
        "note": f"call with {REDACTED} please",
        "database": f"postgres://app:{REDACTED}@db/app",
        "header": f"Bearer {REDACTED}",
        "aws": REDACTED,
        "gh": REDACTED,
        "jwt": REDACTED,
        "config": f"retries=3 api_key={REDACTED} mode=fast",
        "plain": ["chain", "doc:1"],
    }


def test_failure_text_is_redacted_by_the_same_key_names_and_shapes() -> None:
    text = (
        'got {"api_key": "abc", "max_tokens": 5} and accessToken=xyz789, OPENAI_API_KEY=zz '
        "x-api-key: k1 from https://u:pw@host/"
    )
    assert redact_text(text) == (
        f'got {{"api_key": "{REDACTED}", "max_tokens": 5}} and accessToken={REDACTED}, '
        f"OPENAI_API_KEY={REDACTED} x-api-key: {REDACTED} from https://u:{REDACTED}@host/"
    )


def test_key_names() -> None:
    for secret in ("token", "api-key", "ApiKey", "client_secret", "db_password", "Cookie"):
        assert is_secret_key(secret), secret
    for plain in ("max_tokens", "token_count", "keyword", "monkey", "secretary", "author"):
        assert not is_secret_key(plain), plain


async def test_runs_show_redacts_the_payload_and_the_events_as_the_console_does() -> None:
    """``agentruns runs show`` (its table and its ``--json``) follows the same rule."""
    clock = ManualClock(datetime(2026, 3, 1, 12, tzinfo=UTC))
    kinds = agentruns.RunKinds([agentruns.RunKind(agentruns.RunKindPolicy(name="calls"), _calls)])
    async with agentruns.connect(kinds=kinds, family=MemoryFamily(clock), clock=clock) as client:
        run = await client.runs.enqueue(
            "calls", workspace="acme", subject="s", payload={"password": "pw-1", "lang": "en"}
        )
        await client.worker(holder="w").claim_and_drive(limit=1)
        shown, events = await client.runs.get(run.id), await client.runs.events(run.id)
        failures = await client.runs.failures(run.id)
    fields = render.run_fields(shown, events, failures)
    assert fields["payload"] == {"password": REDACTED, "lang": "en"}
    assert fields["events"][0]["data"] == {"api_key": REDACTED, "max_tokens": 512}  # type: ignore[index]
    table = Console(width=400, record=True)
    table.print(render.run(shown, events, failures))
    text = table.export_text()
    assert PROVIDER_KEY not in text
    assert "pw-1" not in text
    assert REDACTED in text


PROVIDER_KEY = "sk-proj-ABCDEFGHIJKLMNOPQRST"


async def _calls(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    yield agentruns.StepEvent("called", {"api_key": PROVIDER_KEY, "max_tokens": 512})
