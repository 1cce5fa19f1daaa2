"""The token-bucket rule of provider limits (agentruns.domain.provider_limits)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings, strategies as st

from agentruns.domain import provider_limits as rule
from agentruns.domain.errors import InvalidRequest
from agentruns.domain.provider_limits import (
    ProviderLimit,
    burst,
    empty_for,
    full,
    parse_limits,
    paused,
    redeclared,
    take,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_burst_is_one_seconds_worth_and_a_period_admits_the_limit() -> None:
    assert burst(600, 60) == pytest.approx(10)
    # A limit of one a minute still refills: at most half the limit is held.
    assert burst(1, 60) == pytest.approx(1 / 60)
    assert burst(10, 1) == pytest.approx(5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"requests": 0},
        {"tokens": -1},
        {"requests": 1.5},
        {"requests": True},
        {"requests": 1, "per": timedelta(0)},
        {"requests": 1, "per": timedelta(days=2)},
    ],
)
def test_nonsense_limits_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        ProviderLimit("openai/gpt-5", **kwargs)  # type: ignore[arg-type]


def test_a_bad_name_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        ProviderLimit(" ", requests=1)


@pytest.mark.parametrize(("requests", "tokens"), [(0, 0), (-1, 0), (0, -5), (1, 2**60)])
def test_nonsense_takes_are_refused(requests: int, tokens: int) -> None:
    limit = ProviderLimit("p", requests=10)
    with pytest.raises(InvalidRequest):
        take(limit, full(limit, T0), requests, tokens, T0)


def test_a_take_beyond_the_bucket_waits_for_the_refill() -> None:
    limit = ProviderLimit("p", requests=600)  # burst 10, 590 over a minute and a second after it
    level = full(limit, T0)
    for _ in range(10):
        answer, level = take(limit, level, 1, 0, T0)
        assert answer.granted
    answer, level = take(limit, level, 1, 0, T0)
    assert not answer.granted
    assert answer.wait == pytest.approx(timedelta(seconds=61 / 590), abs=timedelta(microseconds=2))
    assert empty_for(limit, level, T0) is not None
    later = T0 + answer.wait + timedelta(microseconds=1)
    assert empty_for(limit, level, later) is None
    answer, level = take(limit, level, 1, 0, later)
    assert answer.granted


def test_a_take_larger_than_the_burst_waits_for_a_full_bucket_then_goes_below_zero() -> None:
    limit = ProviderLimit("p", tokens=60_000)  # burst 1,000 tokens
    level = full(limit, T0)
    answer, level = take(limit, level, 0, 5_000, T0)
    assert answer.granted
    assert level.tokens == pytest.approx(-4_000)
    answer, _ = take(limit, level, 0, 1, T0)
    assert not answer.granted


def test_a_dimension_the_limit_does_not_name_is_not_limited() -> None:
    limit = ProviderLimit("p", requests=60)
    answer, _ = take(limit, full(limit, T0), 1, 10**12, T0)
    assert answer.granted


def test_a_pause_refuses_until_it_ends_and_keeps_the_later_end() -> None:
    limit = ProviderLimit("p", requests=600)
    level = paused(full(limit, T0), T0 + timedelta(seconds=30))
    level = paused(level, T0 + timedelta(seconds=10))
    assert level.paused_until == T0 + timedelta(seconds=30)
    answer, level = take(limit, level, 1, 0, T0 + timedelta(seconds=29))
    assert not answer.granted
    assert answer.wait == timedelta(seconds=1)
    answer, _ = take(limit, level, 1, 0, T0 + timedelta(seconds=30))
    assert answer.granted


def test_a_changed_definition_keeps_its_level_within_the_new_burst() -> None:
    old = ProviderLimit("p", requests=600)
    level = full(old, T0)
    _, level = take(old, level, 4, 0, T0)
    smaller = ProviderLimit("p", requests=120, tokens=6_000)
    level = redeclared(old, smaller, level, T0)
    assert level.requests == pytest.approx(2)  # the new burst
    assert level.tokens == pytest.approx(100)  # newly limited: full


@settings(max_examples=60, deadline=None)
@given(
    requests=st.integers(1, 2_000),
    takes=st.lists(st.tuples(st.floats(0, 5), st.integers(1, 50)), min_size=1, max_size=300),
)
def test_no_window_of_a_period_admits_more_than_the_limit_and_one_take(
    requests: int, takes: list[tuple[float, int]]
) -> None:
    limit = ProviderLimit("p", requests=requests, per=timedelta(seconds=60))
    level = full(limit, T0)
    now = T0
    granted: list[tuple[datetime, int]] = []
    for gap, amount in takes:
        now += timedelta(seconds=gap)
        answer, level = take(limit, level, amount, 0, now)
        if answer.granted:
            granted.append((now, amount))
    biggest = max(amount for _, amount in takes)
    for start, _ in granted:
        window = sum(a for at, a in granted if start <= at < start + limit.per)
        assert window <= requests + biggest + 1e-6


def test_limits_are_parsed_as_settings_write_them() -> None:
    assert parse_limits(" openai/gpt-5=500rpm, 2_000_000tpm ; local=10rps;") == (
        ProviderLimit("openai/gpt-5", requests=500, tokens=2_000_000),
        ProviderLimit("local", requests=10, per=timedelta(seconds=1)),
    )
    assert parse_limits("") == ()


@pytest.mark.parametrize(
    "text",
    [
        "gpt",
        "=5rpm",
        "gpt=5",
        "gpt=5rpm,6rpm",
        "gpt=5rpm,6tps",
        "gpt=-5rpm",
        "a=0rpm",
        "a=1rpm;a=2rpm",
    ],
)
def test_nonsense_limit_settings_are_refused(text: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_limits(text)


def test_a_claim_has_room_for_the_kinds_whose_every_limit_has_room() -> None:
    limited = {"chat": ("openai/gpt-5",), "review": ("openai/gpt-5", "anthropic/claude")}
    kinds = ["chat", "review", "digest"]
    assert rule.drawn_from(limited) == ["anthropic/claude", "openai/gpt-5"]
    assert rule.with_room(kinds, limited, {}) == kinds
    assert rule.with_room(kinds, limited, {"anthropic/claude"}) == ["chat", "digest"]
    assert rule.with_room(kinds, limited, {"openai/gpt-5"}) == ["digest"]
