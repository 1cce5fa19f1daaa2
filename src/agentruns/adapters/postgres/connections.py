"""How agentruns opens PostgreSQL connections: the URL forms, and the options every connection
of a process shares (its name, whether a transaction pooler sits in front of the server, its
time bounds).

The composition root decides the options (from the settings and the command); the adapters only
apply them. A database URL may name the pooler itself, ``?agentruns_pooler=transaction``: that
parameter is agentruns', so every URL is stripped of it before libpq or SQLAlchemy sees it
(libpq refuses a parameter it does not know).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from sqlalchemy import URL, make_url

Pooler = Literal["none", "transaction"]
POOLERS: tuple[Pooler, ...] = get_args(Pooler)
POOLER_PARAMETER = "agentruns_pooler"

# libpq sends at most NAMEDATALEN - 1 bytes of application_name; PostgreSQL cuts the rest.
APPLICATION_NAME_BYTES = 63

# Schemes that name PostgreSQL: libpq's two, and SQLAlchemy's with any driver after a "+".
_BACKENDS = ("postgresql", "postgres")


def postgres_url(url: str) -> URL:
    """``url`` parsed, if it names PostgreSQL: ``postgresql://``, ``postgres://`` (as libpq and
    most hosting providers write it) or ``postgresql+driver://``. ValueError otherwise.

    The result keeps every query parameter, agentruns' own too (``with_database`` passes it
    on); :func:`libpq_url` and :func:`sqlalchemy_url` are what connects."""
    parsed = make_url(url)
    if parsed.drivername.split("+", 1)[0] not in _BACKENDS:
        raise ValueError(f"not a PostgreSQL URL: {parsed.render_as_string(hide_password=True)}")
    return parsed


def _connectable(url: str) -> URL:
    return postgres_url(url).difference_update_query([POOLER_PARAMETER])


def sqlalchemy_url(url: str) -> str:
    """A PostgreSQL URL as the async psycopg 3 driver URL SQLAlchemy wants."""
    parsed = _connectable(url).set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The plain ``postgresql://`` URL a bare psycopg connection (or psql) takes."""
    rendered = _connectable(url).set(drivername="postgresql").render_as_string(hide_password=False)
    # SQLAlchemy writes a space of the query as "+", which libpq reads as a plus: startup
    # options ("-csearch_path=a -cstatement_timeout=5s") reach libpq only as %20.
    base, mark, query = rendered.partition("?")
    return base + mark + query.replace("+", "%20")


def url_pooler(url: str) -> Pooler | None:
    """The pooler ``url`` names with ``agentruns_pooler=``, None if it names none; ValueError
    for a value that is not one."""
    found = postgres_url(url).query.get(POOLER_PARAMETER)
    if found is None:
        return None
    value = found if isinstance(found, str) else found[-1]
    for pooler in POOLERS:
        if value == pooler:
            return pooler
    raise ValueError(
        f"{POOLER_PARAMETER}={value!r} in the database URL: choose none or transaction"
    )


def application_name(name: str) -> str:
    """``name`` cut to the 63 bytes libpq sends (on a character boundary)."""
    encoded = name.encode()[:APPLICATION_NAME_BYTES]
    return encoded.decode(errors="ignore")


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """What every connection of one process shares; plain values the composition root decides.

    - ``application_name``: shown in ``pg_stat_activity`` (and PgBouncer's ``SHOW CLIENTS``):
      which process holds a connection. Cut to 63 bytes.
    - ``pooler``: ``transaction`` when a transaction-pooling PgBouncer (or the like) sits in
      front of the server: then no server-side prepared statement and no session ``SET``, as a
      server connection serves another client after every transaction.
    - ``statement_bound``: seconds each of agentruns' statements may take, timed by the client;
      past it the statement is cancelled on the server and the caller gets a
      :class:`~agentruns.domain.errors.DatabaseTimeout`. ``None``: unbounded.
    - ``local_statement_timeout``: seconds, set as ``SET LOCAL statement_timeout`` at the start
      of every transaction (the server enforces it, and a transaction-scoped setting cannot
      leak through a pooler). ``None``: the server's own.
    - ``listen_url``: where the wake-up listener connects, when it must not go through the
      pooler (LISTEN needs a session of its own). ``None``: the database URL, unless the
      pooler is ``transaction`` (then nobody listens and waits poll).
    - ``poll_interval``: how often a worker looks for runs when nothing wakes it (said in the
      warning of a notifier that cannot listen).
    """

    application_name: str = "agentruns"
    pooler: Pooler = "none"
    statement_bound: float | None = None
    local_statement_timeout: float | None = None
    listen_url: str | None = None
    poll_interval: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "application_name", application_name(self.application_name))
        if self.pooler not in POOLERS:
            raise ValueError(f"pooler {self.pooler!r}: choose none or transaction")
        for name in ("statement_bound", "local_statement_timeout"):
            seconds = getattr(self, name)
            if seconds is not None and seconds <= 0:
                raise ValueError(f"{name} is a positive number of seconds, or None")

    def on(self, url: str) -> ConnectionOptions:
        """These options for ``url``: its ``agentruns_pooler=``, when it has one, overrides
        ``pooler``."""
        pooler = url_pooler(url)
        return self if pooler is None or pooler == self.pooler else replace(self, pooler=pooler)

    @property
    def prepares(self) -> bool:
        """Whether statements may be prepared on the server (not through a transaction pooler,
        where the next transaction may run on a server connection that never saw them)."""
        return self.pooler == "none"

    def connect_kwargs(self) -> dict[str, Any]:
        """What psycopg's ``connect`` takes besides the URL: the name, and how to prepare.

        Prepared from a statement's first run on a connection (psycopg's default waits for the
        fifth): the claim costs more to plan than to run (ADRs/0011). Through a transaction
        pooler, never (``prepare_threshold=None``)."""
        return {
            "application_name": self.application_name,
            "prepare_threshold": 0 if self.prepares else None,
        }
