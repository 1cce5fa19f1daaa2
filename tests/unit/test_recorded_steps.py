"""The replay rule of recorded steps: name and occurrence, in recorded order (ADRs/0022)."""

from __future__ import annotations

import pytest

from agentruns.domain.errors import InvalidRequest, InvalidStepResult, StepOutOfOrder
from agentruns.domain.failures import ConfigurationError
from agentruns.domain.recorded_steps import RecordedStep, Replay, read_record, step_record

HISTORY = [
    RecordedStep("plan", 1, {"n": 2}),
    RecordedStep("act", 1, "a"),
    RecordedStep("act", 2, "b"),
]


def test_a_first_attempt_runs_every_step_and_counts_occurrences() -> None:
    """With no history every step runs; each name counts its own occurrences from 1."""
    replay = Replay()
    assert [replay.ask(name) for name in ["plan", "act", "act", "plan"]] == [
        (1, None),
        (1, None),
        (2, None),
        (2, None),
    ]
    replay.finish()


def test_a_resumed_attempt_replays_in_order_then_runs_the_rest() -> None:
    """Recorded steps come back with their results; the next one runs."""
    replay = Replay(HISTORY)
    assert replay.ask("plan") == (1, HISTORY[0])
    assert replay.ask("act") == (1, HISTORY[1])
    assert replay.ask("act") == (2, HISTORY[2])
    assert not replay.replaying
    assert replay.ask("report") == (1, None)
    replay.finish()


@pytest.mark.parametrize(
    ("asked", "message"),
    [
        (["act"], "step 'act' was asked for where step 'plan' was recorded (recorded step 1 of 3)"),
        (["plan", "act", "plan"], "step 'plan #2' was asked for where step 'act #2' was recorded"),
    ],
)
def test_a_step_out_of_its_recorded_order_is_refused_by_name(
    asked: list[str], message: str
) -> None:
    replay = Replay(HISTORY)
    *before, last = asked
    for name in before:
        replay.ask(name)
    with pytest.raises(StepOutOfOrder, match="was asked for") as raised:
        replay.ask(last)
    assert message in str(raised.value)


def test_returning_with_recorded_steps_left_is_refused() -> None:
    replay = Replay(HISTORY)
    replay.ask("plan")
    with pytest.raises(StepOutOfOrder, match="without asking for its recorded step 'act'"):
        replay.finish()


def test_recorded_step_errors_are_configuration_errors() -> None:
    """Not retryable by the default rules, and an invalid result is an invalid request."""
    assert issubclass(StepOutOfOrder, ConfigurationError)
    assert issubclass(InvalidStepResult, ConfigurationError)
    assert issubclass(InvalidStepResult, InvalidRequest)


def test_a_record_is_a_checked_copy_that_reads_back() -> None:
    result = {"items": ("a", "b")}
    record = step_record("plan", 1, result)
    assert record == {"name": "plan", "occurrence": 1, "result": {"items": ["a", "b"]}}
    assert read_record(record) == RecordedStep("plan", 1, None)
    assert read_record(record).result == {"items": ["a", "b"]}


@pytest.mark.parametrize("result", [float("nan"), {1, 2}, b"bytes", {"x": object()}])
def test_a_result_that_is_not_json_is_refused(result: object) -> None:
    with pytest.raises(InvalidStepResult, match="step 'plan #3' returned a result"):
        step_record("plan", 3, result)


@pytest.mark.parametrize(
    "data", [{}, {"name": "a", "occurrence": 0, "result": 1}, {"name": "a", "occurrence": True}]
)
def test_an_event_without_a_record_is_refused(data: dict[str, object]) -> None:
    with pytest.raises(StepOutOfOrder, match="holds no recorded step"):
        read_record(data)  # type: ignore[arg-type]


def test_a_step_name_is_checked_like_every_name() -> None:
    with pytest.raises(InvalidRequest):
        Replay().ask("")
