"""The schema agentruns lives in (``AGENTRUNS_SCHEMA``), carried by the database URL itself.

The adapter's statements name their tables unqualified, so the schema is the connection's
``search_path``. :func:`in_schema` writes it into the URL as libpq's startup option
(``options=-csearch_path=<schema>``), so every connection opened from that URL — the engine's
pool, the bare statement pool, the listener, the administration and migration connections —
starts in it, with no statement of its own. :func:`schema_of` reads it back, which is how a
migration knows which schema to create and where Alembic's version table goes.

A transaction pooler (PgBouncer in transaction mode and its kind) refuses startup options. Behind
one, leave ``AGENTRUNS_SCHEMA`` unset for the processes that connect through it and give their
role the schema instead, ``ALTER ROLE name SET search_path = <schema>`` (``agentruns db grants``
prints it); migrate over a direct connection with the setting.
"""

from __future__ import annotations

import re

from sqlalchemy import make_url

# A plain, unquoted PostgreSQL name: it means the same in a URL, in search_path and in SQL.
PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_OPTION = re.compile(r"-c\s*search_path=(\S+)")


def plain_schema(name: str) -> str:
    """``name`` if it is a plain schema name, else ValueError saying what one is."""
    if not PLAIN_NAME.fullmatch(name):
        raise ValueError(
            f"not a plain schema name: {name!r} (lower-case letters, digits and _, not starting "
            "with a digit, at most 63 characters)"
        )
    return name


def in_schema(url: str, schema: str | None) -> str:
    """``url`` whose connections start with ``search_path`` set to ``schema`` (``None``: the
    server's search_path, ``url`` unchanged). Other startup options of the URL are kept."""
    if schema is None:
        return url
    plain_schema(schema)
    if schema_of(url) == schema:
        return url
    parsed = make_url(url)
    given = parsed.query.get("options", "")
    options = " ".join(given) if isinstance(given, tuple) else given
    # The last setting of a parameter wins: a search_path the URL had gives way to this one.
    wanted = f"{options} -csearch_path={schema}".strip()
    return parsed.update_query_dict({"options": wanted}).render_as_string(hide_password=False)


def schema_of(url: str) -> str | None:
    """The schema ``url``'s startup options set as search_path, if it is one plain name."""
    given = make_url(url).query.get("options", "")
    options = " ".join(given) if isinstance(given, tuple) else given
    found = _OPTION.findall(options)
    if not found or not PLAIN_NAME.fullmatch(found[-1]):
        return None
    return str(found[-1])
