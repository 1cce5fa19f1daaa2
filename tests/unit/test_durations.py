"""One duration parser for the command line and the settings."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentruns.domain.durations import MAX_DURATION, parse_duration
from agentruns.domain.errors import InvalidDuration
from agentruns.entrypoints.settings import AgentRunsSettings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", timedelta(days=7)),
        ("12h", timedelta(hours=12)),
        ("30m", timedelta(minutes=30)),
        ("45s", timedelta(seconds=45)),
        ("500ms", timedelta(milliseconds=500)),
        ("2w", timedelta(weeks=2)),
        ("90", timedelta(seconds=90)),
        ("0.2", timedelta(milliseconds=200)),
        ("1.5h", timedelta(minutes=90)),
        ("1h30m", timedelta(minutes=90)),
        ("1d 12h", timedelta(hours=36)),
        ("PT30S", timedelta(seconds=30)),
        ("PT5M", timedelta(minutes=5)),
        ("P1DT12H", timedelta(hours=36)),
        ("P2W", timedelta(weeks=2)),
        ("0", timedelta(0)),
        (45, timedelta(seconds=45)),
    ],
)
def test_durations_read_as_operators_write_them(text: object, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text", ["", "soon", "7 days", "-1d", "1y", "P", "PT", "P1DT", "999999999d", "nan", True]
)
def test_a_duration_that_is_not_one_is_refused_with_a_clear_message(text: object) -> None:
    with pytest.raises(InvalidDuration):
        parse_duration(text)


def test_a_century_is_the_longest_duration() -> None:
    assert parse_duration(f"{MAX_DURATION.days}d") == MAX_DURATION
    with pytest.raises(InvalidDuration, match="longer than"):
        parse_duration(f"{MAX_DURATION.days + 1}d")


def test_the_settings_read_durations_with_the_same_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUNS_SHUTDOWN_GRACE", "1m30s")
    monkeypatch.setenv("AGENTRUNS_POLL_INTERVAL", "500ms")
    monkeypatch.setenv("AGENTRUNS_BAND_AGING", "PT5M")
    settings = AgentRunsSettings()
    assert settings.shutdown_grace == timedelta(seconds=90)
    assert settings.poll_interval == timedelta(milliseconds=500)
    assert settings.band_aging == timedelta(minutes=5)
    monkeypatch.setenv("AGENTRUNS_SHUTDOWN_GRACE", "forever")
    with pytest.raises(ValueError, match="shutdown_grace"):
        AgentRunsSettings()
