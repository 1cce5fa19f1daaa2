"""The documented limits of what agentruns stores, checked in the domain before any write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from agentruns.domain import limits
from agentruns.domain.backoff import Backoff
from agentruns.domain.errors import InvalidPayload, InvalidRequest
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.payload import sealed_payload, validate_payload


@pytest.mark.parametrize(
    "changes",
    [
        {"lease": timedelta(0)},
        {"lease": timedelta(seconds=-1)},
        {"lease": timedelta(days=2)},
        {"deadline": timedelta(0)},
        {"deadline": timedelta(minutes=-5)},
        {"deadline": timedelta(days=400)},
        {"retry_budget": -1},
        {"retry_budget": True},
        {"backoff": Backoff(cap=timedelta(days=1000))},
        {"name": "chat\x00"},
        {"name": "  "},
    ],
    ids=str,
)
def test_a_kind_policy_outside_the_limits_is_refused_where_it_is_built(
    changes: dict[str, object],
) -> None:
    """Leases and deadlines are positive and bounded, so now + either is always a time."""
    with pytest.raises(InvalidRequest):
        RunKindPolicy(**{"name": "chat", **changes})  # type: ignore[arg-type]


def test_a_kind_policy_at_the_limits_is_accepted() -> None:
    policy = RunKindPolicy(name="chat", lease=limits.MAX_LEASE, deadline=limits.MAX_DEADLINE)
    assert policy.deadline == timedelta(days=366)


@pytest.mark.parametrize(
    "payload",
    [
        {"x": 2**63},
        {"x": -(2**63)},
        {"x": 10**5000},
        {"x": 2.0**53},
        {"x": -1e300},
        {"x": float("inf")},
        {"x": "a\x00"},
        {"a\x00": 1},
        {"x": ["\ud800"]},
        {"\udfff": 1},
        {"x": "y" * limits.MAX_JSON_BYTES},
        {"x": ["é" * (limits.MAX_JSON_BYTES // 2)]},
    ],
    ids=[
        "2**63",
        "-2**63",
        "5000-digits",
        "float-2**53",
        "-1e300",
        "inf",
        "nul",
        "nul-key",
        "surrogate",
        "surrogate-key",
        "1-MiB-of-ascii",
        "1-MiB-of-utf8",
    ],
)
def test_a_payload_that_cannot_read_back_equal_is_refused(payload: object) -> None:
    with pytest.raises(InvalidPayload):
        validate_payload(payload)


def test_a_payload_at_the_limits_is_accepted() -> None:
    payload = {"big": 2**63 - 1, "small": -(2**63) + 1, "float": 2.0**53 - 1, "text": "é\u2028"}
    assert validate_payload(payload) == payload
    room = limits.MAX_JSON_BYTES - len('{"x":""}')
    assert validate_payload({"x": "y" * room}) == {"x": "y" * room}


@pytest.mark.parametrize(
    "value",
    [
        "2026-03-01T12:00:00Z",
        datetime(2026, 3, 1),
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-2))),
    ],
    ids=["string", "naive", "before-year-1", "after-year-9999"],
)
def test_a_moment_is_aware_and_within_the_years_1_to_9999(value: object) -> None:
    with pytest.raises(InvalidRequest):
        limits.moment(value, "due_at")


def test_a_deadline_comes_after_the_due_time() -> None:
    due = datetime(2026, 3, 1, tzinfo=UTC)
    limits.deadline_after_due(due, due + timedelta(microseconds=1))
    limits.deadline_after_due(None, due)
    with pytest.raises(InvalidRequest):
        limits.deadline_after_due(due, due)


def test_an_error_never_carries_a_whole_huge_input() -> None:
    with pytest.raises(InvalidRequest) as refused:
        limits.name(["x" * 1_000_000], "subject")
    assert len(str(refused.value)) < 200


def test_a_sealed_record_is_checked_once_and_a_callers_payload_every_time() -> None:
    """A recorded step's record is written before any caller holds it, so its write's check is
    free; a payload a caller holds is checked (copied) each time, changed or not."""
    sealed = sealed_payload({"name": "plan", "occurrence": 1, "result": [1, 2]})
    assert validate_payload(sealed) is sealed
    plain = validate_payload({"a": 1})
    assert validate_payload(plain) is not plain
    plain["a"] = float("nan")
    with pytest.raises(InvalidPayload):
        validate_payload(plain)
