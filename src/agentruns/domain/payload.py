"""Run payloads are JSON objects; anything else is refused before it is written."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeAlias

from agentruns.domain.errors import InvalidPayload

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
JsonObject: TypeAlias = dict[str, JsonValue]

_MAX_DEPTH = 64


def _check(value: object, path: str, depth: int) -> JsonValue:
    if depth > _MAX_DEPTH:
        raise InvalidPayload(f"payload nests deeper than {_MAX_DEPTH} levels at {path}")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidPayload(f"payload holds a non-finite number at {path}")
        return value
    if isinstance(value, (list, tuple)):
        return [_check(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]
    if isinstance(value, Mapping):
        checked: dict[str, JsonValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidPayload(f"payload has a non-string key {key!r} at {path}")
            checked[key] = _check(item, f"{path}.{key}", depth + 1)
        return checked
    raise InvalidPayload(f"payload holds a {type(value).__name__} at {path}, not a JSON value")


def validate_payload(value: object) -> JsonObject:
    """A checked copy of ``value`` if it is a JSON object; :class:`InvalidPayload` if not."""
    if not isinstance(value, Mapping):
        raise InvalidPayload(f"payload must be a JSON object, not {type(value).__name__}")
    checked = _check(value, "$", 0)
    assert isinstance(checked, dict)  # a Mapping checks to a dict
    return checked
