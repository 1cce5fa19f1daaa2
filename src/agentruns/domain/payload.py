"""Run payloads are JSON objects; anything else is refused before it is written.

An accepted payload reads back equal from every adapter: its text is storable (valid Unicode, no
NUL), its numbers are ones PostgreSQL's jsonb and every JSON reader keep exactly, and it fits the
size and depth limits of :mod:`agentruns.domain.limits`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TypeAlias

from agentruns.domain.errors import InvalidPayload, InvalidRunResult
from agentruns.domain.limits import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_JSON_FLOAT,
    MAX_JSON_INTEGER,
)

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
JsonObject: TypeAlias = dict[str, JsonValue]

_MAX_DEPTH = MAX_JSON_DEPTH


class _Walk:
    """One pass over a value: a checked copy, and a running lower bound of its encoded size (no
    separators, one byte per character), so an oversized payload is refused before it is ever
    serialised whole."""

    def __init__(self) -> None:
        self.size = 0

    def _count(self, characters: int, path: str) -> None:
        self.size += characters
        if self.size > MAX_JSON_BYTES:
            raise InvalidPayload(f"payload is larger than {MAX_JSON_BYTES} bytes (at {path})")

    def _text(self, value: str, path: str) -> str:
        self._count(len(value) + 2, path)
        if "\x00" in value:
            raise InvalidPayload(f"payload holds a NUL character at {path}")
        return value

    def check(self, value: object, path: str, depth: int) -> JsonValue:
        if depth > _MAX_DEPTH:
            raise InvalidPayload(f"payload nests deeper than {_MAX_DEPTH} levels at {path}")
        if value is None or isinstance(value, bool):
            self._count(4, path)
            return value
        if isinstance(value, int):
            if not -MAX_JSON_INTEGER <= value <= MAX_JSON_INTEGER:
                raise InvalidPayload(f"payload holds an integer beyond 64 bits at {path}")
            self._count(1, path)
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidPayload(f"payload holds a non-finite number at {path}")
            if abs(value) >= MAX_JSON_FLOAT:
                raise InvalidPayload(
                    f"payload holds a number of magnitude 2**53 or more at {path}: "
                    "such a number is exact only as an integer"
                )
            self._count(1, path)
            return value
        if isinstance(value, str):
            return self._text(value, path)
        if isinstance(value, (list, tuple)):
            self._count(2, path)
            return [
                self.check(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)
            ]
        if isinstance(value, Mapping):
            self._count(2, path)
            checked: dict[str, JsonValue] = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise InvalidPayload(f"payload has a non-string key at {path}")
                inner = f"{path}.{key[:40]}"
                checked[self._text(key, inner)] = self.check(item, inner, depth + 1)
            return checked
        raise InvalidPayload(f"payload holds a {type(value).__name__} at {path}, not a JSON value")


class _Sealed(dict[str, JsonValue]):
    """A checked JSON object that no caller's code holds: checked again, it is returned as it is.
    Only :func:`sealed_payload` makes one."""

    __slots__ = ()


def sealed_payload(value: object) -> JsonObject:
    """As :func:`validate_payload`, for a value that is written before any caller's code gets
    hold of it (a recorded step's record, checked when the step returns and written at its
    boundary): the write's own check of it is then free. Never for a value handed to a caller,
    who could change it after the check."""
    return _Sealed(validate_payload(value))


def validate_payload(value: object) -> JsonObject:
    """A checked copy of ``value`` if it is a JSON object within the limits;
    :class:`InvalidPayload` if not."""
    if type(value) is _Sealed:
        return value
    if not isinstance(value, Mapping):
        raise InvalidPayload(f"payload must be a JSON object, not {type(value).__name__}")
    checked = _checked(value)
    assert isinstance(checked, dict)  # a Mapping checks to a dict
    return checked


def validate_result(value: object) -> JsonValue:
    """A checked copy of a run's result (ADRs/0026): any JSON value within the payload limits
    (``None``: no result); :class:`~agentruns.domain.errors.InvalidRunResult` if not."""
    if value is None:
        return None
    try:
        return _checked(value)
    except InvalidPayload as refused:
        raise InvalidRunResult(f"a run's result: {refused}") from None


def _checked(value: object) -> JsonValue:
    checked = _Walk().check(value, "$", 0)
    try:
        encoded = json.dumps(checked, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPayload(
            "payload holds text that is not valid Unicode (a lone surrogate)"
        ) from None
    if len(encoded) > MAX_JSON_BYTES:
        raise InvalidPayload(f"payload is larger than {MAX_JSON_BYTES} bytes as JSON")
    return checked
