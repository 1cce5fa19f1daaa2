"""What a failed attempt leaves on its run: the error's type, message and class, the attempt and
epoch it happened in, and a bounded traceback that echoes neither the payload nor a secret.

:func:`describe_failure` turns an exception into a :class:`FailureDetail`: pure string work (the
standard library's ``traceback`` formats the frames; no locals are captured, so no variable's
value reaches the text), then redacted by the rule that every view shares
(:mod:`agentruns.domain.redaction`: the payload's secrets and longer strings, anything keyed or
shaped like a credential), and each part is cut to its cap. The stores keep one
:class:`FailureRecord` per failed attempt for the run's life and the newest as the run's
:class:`LastFailure`, so a list of runs can say why each failed without reading the records.
"""

from __future__ import annotations

import sys
import traceback as tb
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from agentruns.domain.failures import FailureClass
from agentruns.domain.payload import JsonObject
from agentruns.domain.redaction import PayloadEchoes

MAX_TYPE = 200
MAX_MESSAGE = 1_000
MAX_TRACEBACK = 8_000


@dataclass(frozen=True, slots=True)
class FailureDetail:
    """A failure as it may be stored and shown: bounded and redacted."""

    error_type: str
    message: str
    failure_class: FailureClass
    traceback: str
    # The seconds the provider asked to wait (a Retry-After), when it said.
    retry_after: float | None = None

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
    # The seconds the provider asked to wait (a Retry-After in seconds or as an HTTP date), when
    # it said; the run's requeue was at least that late (ADRs/0032).
    retry_after: float | None = None

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
    chain), redacted by the one rule of :mod:`agentruns.domain.redaction` (``payload``'s secrets
    and content, anything shaped like a credential), each part capped."""
    echoes = PayloadEchoes(payload)
    message = echoes.redact(" ".join(str(error).split()))
    text = "".join(tb.format_exception(error))
    return FailureDetail(
        error_type=error_type_name(error),
        message=_cut(message, MAX_MESSAGE),
        failure_class=failure_class,
        traceback=_cut_middle(echoes.redact(text), MAX_TRACEBACK),
    )


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
