"""Structured log lines: one JSON object (or ``key=value`` pairs) per record.

The worker and the reaper log every line about a run with ``extra=`` carrying its run id, kind,
workspace, subject and epoch; these formatters put every such field on the line, so an operator
can follow one run (or one epoch of it) across processes with a plain text search.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import IO, Literal

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}

LogFormat = Literal["json", "kv"]


def record_fields(record: logging.LogRecord) -> dict[str, object]:
    """The fields of one line: time, level, logger, message, the ``extra=`` fields, and the
    exception if there was one."""
    fields: dict[str, object] = {
        "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_"):
            fields[key] = value
    if record.exc_info:
        fields["error"] = logging.Formatter().formatException(record.exc_info)
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record_fields(record), default=str, ensure_ascii=False)


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={_quote(value)}" for key, value in record_fields(record).items())


def _quote(value: object) -> str:
    text = str(value)
    if not text or any(char.isspace() or char in '"=' for char in text):
        return json.dumps(text, ensure_ascii=False)
    return text


def configure_logging(
    *, level: int | str = logging.INFO, format: LogFormat = "json", stream: IO[str] | None = None
) -> logging.Handler:
    """Send agentruns' loggers to ``stream`` (stderr by default) in the given format."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if format == "json" else KeyValueFormatter())
    logger = logging.getLogger("agentruns")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler
