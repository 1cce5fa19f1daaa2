"""Recorded steps: a step's identity, its record, and the replay rule (ADRs/0022).

A recorded step is a step event of type :data:`RECORDED_STEP` whose data is
``{"name": ..., "occurrence": ..., "result": ...}``. A step is identified by its name and its
occurrence: the how-manieth call of that name in the run (the first ``"plan"`` is occurrence
1, the next ``"plan"`` occurrence 2). A resumed run's code asks for its steps again in order;
the n-th step it asks for must be the n-th recorded one, by name and occurrence, and then it
gets the recorded result without running. Once its recorded steps are all replayed, the next
steps run and are recorded. A step asked for where another was recorded, or a run that returns
before it asked for all of its recorded steps, is :class:`StepOutOfOrder`: the result of a step
is never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agentruns.domain import limits
from agentruns.domain.errors import InvalidRequest, InvalidStepResult, StepOutOfOrder
from agentruns.domain.payload import JsonObject, JsonValue, sealed_payload

# The event type of a recorded step; a recorded kind's history is its events of this type.
RECORDED_STEP = "step.recorded"


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One recorded step: its name, its occurrence (from 1) and its JSON result."""

    name: str
    occurrence: int
    result: JsonValue = field(compare=False)

    @property
    def label(self) -> str:
        """How errors and readers name the step: ``plan`` or ``plan #2``."""
        return self.name if self.occurrence == 1 else f"{self.name} #{self.occurrence}"


def step_record(name: str, occurrence: int, result: object) -> JsonObject:
    """The event data recording ``result`` for the step: a checked copy, or
    :class:`InvalidStepResult` (not JSON, or the record would pass the payload limits)."""
    try:
        # Sealed: the record goes straight to its boundary's write, whose check is then free.
        return sealed_payload({"name": name, "occurrence": occurrence, "result": result})
    except InvalidRequest as error:
        label = RecordedStep(name, occurrence, None).label
        detail = str(error).replace("payload", "the record").replace("$.result", "the result")
        raise InvalidStepResult(
            f"step {label!r} returned a result that cannot be recorded: {detail} (a recorded "
            f"result is a JSON value of at most {limits.MAX_JSON_BYTES} bytes with its name)"
        ) from error


def read_record(data: JsonObject) -> RecordedStep:
    """The recorded step an event's data holds (:class:`StepOutOfOrder` if it holds none)."""
    name = data.get("name")
    occurrence = data.get("occurrence")
    if (
        not isinstance(name, str)
        or isinstance(occurrence, bool)
        or not isinstance(occurrence, int)
        or occurrence < 1
        or "result" not in data
    ):
        raise StepOutOfOrder(f"a {RECORDED_STEP!r} event holds no recorded step: {data!r:.80}")
    return RecordedStep(name, occurrence, data["result"])


class Replay:
    """The replay of one attempt: which step comes next, and whether it was recorded.

    ``history`` is the run's recorded steps in the order they were recorded (empty for a first
    attempt). :meth:`ask` is called once per step the code asks for, in order; :meth:`finish`
    once the code returned."""

    def __init__(self, history: Iterable[RecordedStep] = ()) -> None:
        self._history = list(history)
        self._next = 0
        self._seen: dict[str, int] = {}

    @property
    def replaying(self) -> bool:
        """Whether recorded steps remain to be replayed."""
        return self._next < len(self._history)

    def ask(self, name: str) -> tuple[int, RecordedStep | None]:
        """The step's occurrence, and its record when it was recorded (then it must not run);
        :class:`StepOutOfOrder` when another step was recorded at this place."""
        limits.name(name, "a step's name")
        occurrence = self._seen.get(name, 0) + 1
        self._seen[name] = occurrence
        if not self.replaying:
            return occurrence, None
        recorded = self._history[self._next]
        asked = RecordedStep(name, occurrence, None)
        if (recorded.name, recorded.occurrence) != (name, occurrence):
            raise StepOutOfOrder(
                f"step {asked.label!r} was asked for where step {recorded.label!r} was recorded "
                f"(recorded step {self._next + 1} of {len(self._history)}): the kind's code no "
                "longer follows its recorded steps"
            )
        self._next += 1
        return occurrence, recorded

    def finish(self) -> None:
        """The code returned: :class:`StepOutOfOrder` if it left recorded steps unasked."""
        if self.replaying:
            left = self._history[self._next]
            raise StepOutOfOrder(
                f"the run returned without asking for its recorded step {left.label!r} "
                f"(recorded step {self._next + 1} of {len(self._history)})"
            )
