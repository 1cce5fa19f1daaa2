"""What a failed attempt leaves on its run: the error's type, message and class, the attempt and
epoch it happened in, and a bounded traceback that echoes neither the payload nor a secret.

:func:`describe_failure` turns an exception into a :class:`FailureDetail`: pure string work (the
standard library's ``traceback`` formats the frames; no locals are captured, so no variable's
value reaches the text), then every string value of the run's payload and anything shaped like a
credential is replaced, and each part is cut to its cap. The stores keep one
:class:`FailureRecord` per failed attempt for the run's life and the newest as the run's
:class:`LastFailure`, so a list of runs can say why each failed without reading the records.
"""

from __future__ import annotations

import re
import sys
import traceback as tb
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from agentruns.domain.failures import FailureClass
from agentruns.domain.payload import JsonObject, JsonValue

MAX_TYPE = 200
MAX_MESSAGE = 1_000
MAX_TRACEBACK = 8_000
# Payload strings shorter than this are too common to find reliably (and to leak much).
_MIN_ECHO = 4
_MAX_ECHOES = 256

PAYLOAD = "[payload]"
REDACTED = "[redacted]"

_SECRETS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]+):[^@\s/]+@"), rf"\1:{REDACTED}@"),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {REDACTED}"),
    (
        re.compile(
            r"(?i)\b(x-api-key|api[_-]?key|apikey|access[_-]?token|auth[_-]?token|token|secret|"
            r"password|passwd|pwd|authorization)([\"']?\s*[:=]\s*[\"']?)([^\s\"',;&}]+)"
        ),
        rf"\1\2{REDACTED}",
    ),
    # Provider keys: sk-..., sk-ant-..., pk-..., rk-...
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"), REDACTED),
)


@dataclass(frozen=True, slots=True)
class FailureDetail:
    """A failure as it may be stored and shown: bounded and redacted."""

    error_type: str
    message: str
    failure_class: FailureClass
    traceback: str

    @property
    def summary(self) -> LastFailure:
        return LastFailure(self.error_type, self.message, self.failure_class)


@dataclass(frozen=True, slots=True)
class LastFailure:
    """The newest failure of a run, kept on the run itself for list views."""

    error_type: str
    message: str
    failure_class: FailureClass

    def __str__(self) -> str:
        return f"{self.error_type}: {self.message}" if self.message else self.error_type


@dataclass(frozen=True, slots=True)
class FailureRecord:
    """One failed attempt of a run, kept for the run's life (purged with it).

    ``epoch`` is the claim the failure happened under and ``attempt`` the attempts the run had
    spent before it; ``holder`` is who held the lease (the worker, or the lost holder the reaper
    took the run back from).
    """

    run_id: UUID
    id: int
    epoch: int
    attempt: int
    holder: str | None
    error_type: str
    message: str
    failure_class: FailureClass
    traceback: str
    recorded_at: datetime

    @property
    def summary(self) -> LastFailure:
        return LastFailure(self.error_type, self.message, self.failure_class)


def error_type_name(error: BaseException) -> str:
    """``KeyError`` for a builtin, ``agentruns.ProviderError`` for a class the package exports
    (its public name: the module it lives in may move), else ``module.QualifiedName``
    (``openai.RateLimitError``, a host's ``myapp.kinds.QuotaError``)."""
    cls = type(error)
    module = cls.__module__
    if module == "builtins":
        name = cls.__qualname__
    elif _is_exported(cls):
        name = f"{_PACKAGE}.{cls.__qualname__}"
    else:
        name = f"{module}.{cls.__qualname__}"
    return _cut(name, MAX_TYPE)


_PACKAGE = "agentruns"


def _is_exported(cls: type) -> bool:
    """Whether ``agentruns.<name>`` is this very class. The package is already imported (it is
    this module's parent) and loads its names lazily, so the lookup costs a dict read; it is
    looked up in ``sys.modules`` rather than imported so that the domain does not depend on the
    package's surface, which names every layer."""
    if not cls.__module__.startswith(f"{_PACKAGE}."):
        return False
    package = sys.modules.get(_PACKAGE)
    exported: object = getattr(package, "__all__", ())
    if not isinstance(exported, list) or cls.__qualname__ not in exported:
        return False
    return getattr(package, cls.__qualname__, None) is cls


def describe_failure(
    error: BaseException, failure_class: FailureClass, payload: JsonObject | None = None
) -> FailureDetail:
    """The storable detail of ``error``: its type, its message and its traceback (with its cause
    chain), with ``payload``'s strings and credential-shaped text replaced, each part capped."""
    echoes = _payload_strings(payload or {})
    message = redact(" ".join(str(error).split()), echoes)
    text = "".join(tb.format_exception(error))
    return FailureDetail(
        error_type=error_type_name(error),
        message=_cut(message, MAX_MESSAGE),
        failure_class=failure_class,
        traceback=_cut_middle(redact(text, echoes), MAX_TRACEBACK),
    )


def redact(text: str, payload_strings: list[str] | None = None) -> str:
    """``text`` without the given payload strings and without credential-shaped substrings."""
    for echo in payload_strings or []:
        text = text.replace(echo, PAYLOAD)
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def _payload_strings(payload: JsonObject) -> list[str]:
    """The payload's string values worth finding, longest first (so a longer value is replaced
    before a shorter one inside it)."""
    found = {value for value in _strings(payload) if len(value) >= _MIN_ECHO}
    return sorted(found, key=len, reverse=True)[:_MAX_ECHOES]


def _strings(value: JsonValue) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cut_middle(text: str, limit: int) -> str:
    """Keep the start (the outermost frames) and the end (the raise and the error), which are
    what a reader looks for, and say how much was left out between them."""
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head - 60
    omitted = len(text) - head - tail
    return f"{text[:head]}\n  ... {omitted} characters omitted ...\n{text[-tail:]}"
