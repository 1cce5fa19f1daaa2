"""One redaction rule for everything agentruns shows: failure records, event data and payloads.

A value is hidden for one of two reasons, the same wherever it is shown:

- **its key names a secret** (:func:`is_secret_key`): ``api_key``, ``openai_api_key``,
  ``accessToken``, ``password``, ``Authorization``... (compared as ``snake_case``, the name or
  its last words), so in JSON its value is ``[redacted]``, and in text ``api_key=...`` or
  ``"password": "..."`` keeps its key and loses its value;
- **it is shaped like a credential** (:data:`SECRET_SHAPES`): a URL's password, a bearer or
  basic token, a provider's key (``sk-...``, ``ghp_...``, ``AKIA...``), a JWT; in any string,
  under any key.

Failure text (a message, a traceback) is the host's code talking about its input, so it also
loses the run's payload: the values under secret keys (``[redacted]``) and its longer strings
(``[payload]``). A payload string shorter than :data:`MIN_ECHO` characters is an identifier
(``"chain"``, ``"en"``, ``"doc:1"``), not content, and replacing it would cut words out of
messages (``fallback [payload] exhausted``); and a value is replaced only where it stands as a
whole, not inside a longer word. The run's data itself is never rewritten: only what is shown
(the console, ``agentruns runs show``, the failure records) is redacted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from agentruns.domain.payload import JsonValue

PAYLOAD = "[payload]"
REDACTED = "[redacted]"

# A payload string shorter than this is not replaced in failure text (an identifier, not content).
MIN_ECHO = 8
# A secret-keyed value shorter than this is not searched for in failure text (it would match
# everywhere); its key=value form is still redacted.
MIN_SECRET_ECHO = 4
MAX_ECHOES = 256

# The names of secrets, in snake_case. A key is secret when it is one of them or ends with one
# after an underscore (``openai_api_key``, ``github_token``), so ``max_tokens`` is not.
SECRET_NAMES: tuple[str, ...] = (
    "api_key",
    "apikey",
    "access_key",
    "access_token",
    "auth_token",
    "refresh_token",
    "id_token",
    "session_token",
    "token",
    "secret",
    "client_secret",
    "secret_key",
    "private_key",
    "password",
    "passwd",
    "pwd",
    "authorization",
    "credentials",
    "cookie",
)

SECRET_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]+):[^@\s/]+@"), rf"\1:{REDACTED}@"),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {REDACTED}"),
    # Provider keys: sk-..., sk-ant-..., pk-..., rk-...; GitHub, Slack, AWS access keys; JWTs.
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"), REDACTED),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
)

# ``key=value``, ``key: value``, ``"key": "value"`` in text, for the same names (in text a key
# may be spelt with ``-`` or in camelCase: both are folded the way is_secret_key folds them).
_NAMES = "|".join(
    sorted((name.replace("_", "[_-]?") for name in SECRET_NAMES), key=len, reverse=True)
)
_KEYED = re.compile(
    rf"(?i)(?<![A-Za-z0-9])((?:[A-Za-z0-9]+[_-])*(?:{_NAMES}))"
    r"([\"']?\s*[:=]\s*[\"']?)([^\s\"',;&}]+)"
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def is_secret_key(key: str) -> bool:
    """Whether a mapping key names a secret: ``apiKey``, ``X-Api-Key`` and ``OPENAI_API_KEY``
    fold to ``api_key``; a key is secret when it is a name of :data:`SECRET_NAMES` or ends with
    one after an underscore."""
    folded = _CAMEL.sub("_", key).lower().replace("-", "_").strip("_")
    return any(folded == name or folded.endswith(f"_{name}") for name in SECRET_NAMES)


def redact_text(text: str) -> str:
    """``text`` without credential-shaped substrings and without the values of secret keys."""
    for pattern, replacement in SECRET_SHAPES:
        text = pattern.sub(replacement, text)
    return _KEYED.sub(rf"\1\2{REDACTED}", text)


def redact_json(value: JsonValue) -> JsonValue:
    """A JSON value as it may be shown: every value under a secret key ``[redacted]`` (whatever
    it held), every string redacted as text; the structure and the other values unchanged."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {
            key: REDACTED if is_secret_key(key) and item is not None else redact_json(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact_json(item) for item in value]
    return value


class PayloadEchoes:
    """What failure text must not repeat of a run's payload: its secret-keyed strings (at least
    :data:`MIN_SECRET_ECHO` characters) and its other strings of at least :data:`MIN_ECHO`,
    each found only where it stands whole (not inside a longer word)."""

    __slots__ = ("_content", "_secrets")

    def __init__(self, payload: Mapping[str, JsonValue] | None = None) -> None:
        secrets: set[str] = set()
        content: set[str] = set()
        for secret, text in _strings(dict(payload or {}), under_secret=False):
            if secret and len(text) >= MIN_SECRET_ECHO:
                secrets.add(text)
            elif len(text) >= MIN_ECHO:
                content.add(text)
        self._secrets = _whole(secrets)
        self._content = _whole(content - secrets)

    def redact(self, text: str) -> str:
        """``text`` without the payload's secrets and content, then as :func:`redact_text`."""
        if self._secrets is not None:
            text = self._secrets.sub(REDACTED, text)
        if self._content is not None:
            text = self._content.sub(PAYLOAD, text)
        return redact_text(text)


def _whole(values: set[str]) -> re.Pattern[str] | None:
    """One pattern for ``values``, longest first (a longer value is replaced before a shorter
    one inside it), each not preceded nor followed by a word character."""
    if not values:
        return None
    ordered = sorted(values, key=len, reverse=True)[:MAX_ECHOES]
    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(value) for value in ordered) + r")(?!\w)")


def _strings(value: JsonValue, *, under_secret: bool) -> Iterator[tuple[bool, str]]:
    if isinstance(value, str):
        yield under_secret, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, under_secret=under_secret or is_secret_key(key))
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, under_secret=under_secret)
