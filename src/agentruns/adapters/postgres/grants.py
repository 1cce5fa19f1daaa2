"""Least-privilege roles: what each role needs on each of agentruns' objects, and the statements
that give it (``agentruns db grants``).

- ``owner`` owns the schema and everything in it, and runs ``agentruns db upgrade``. An
  administrator gives it the database and the schema; it needs nothing on the objects it creates.
- ``worker``: every process that writes runs (workers, reapers, schedulers, the gateway, the host
  application that enqueues, a console that cancels or retries): DML on the tables, USAGE on the
  sequences behind their defaults, EXECUTE on the functions its statements call; no DDL.
- ``reader``: a read-only console (``--read-only``), ``agentruns status``, ``runs list`` and
  ``runs show``, reports: SELECT only.

:data:`OBJECTS` is the one list: every table, sequence and function the migrations create, with
what a worker and a reader need on it and why. It is read off the statements the adapter sends
(``sql.py``, ``stats.py``, ``sandbox_sql.py``, ``schedule_sql.py``, ``admin.py``) and those its
functions and triggers run (``ddl/``): both run with the privileges of the role whose statement
fired them (no function is SECURITY DEFINER). LISTEN and NOTIFY need no privilege. Tests hold
the list to the metadata and to the migrated catalogue, and run workers, a reaper and the console
under the grants it makes (``tests/postgres/test_roles.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import psycopg
from sqlalchemy import make_url

from agentruns.adapters.postgres.admin import connect
from agentruns.adapters.postgres.search_path import plain_schema, schema_of
from agentruns.domain.errors import InvalidRequest, StoreUnavailable

Role = Literal["owner", "worker", "reader"]
ROLES: tuple[Role, ...] = ("owner", "worker", "reader")

ObjectKind = Literal["TABLE", "SEQUENCE", "FUNCTION"]

_DML = ("SELECT", "INSERT", "UPDATE", "DELETE")
_READ = ("SELECT",)
_TRIGGER = "a trigger's function: EXECUTE is checked when the trigger is created, not when it fires"


@dataclass(frozen=True, slots=True)
class Privileges:
    """What the worker and the reader roles need on one object of the schema, and why (the
    owner owns it). A function is named with its argument types, as GRANT takes it."""

    kind: ObjectKind
    name: str
    worker: tuple[str, ...]
    reader: tuple[str, ...]
    why: str

    @property
    def object_name(self) -> str:
        """The name alone, without a function's argument types."""
        return self.name.partition("(")[0]

    def of(self, role: Role) -> tuple[str, ...]:
        return self.worker if role == "worker" else self.reader if role == "reader" else ()


def _table(name: str, worker: tuple[str, ...], why: str) -> Privileges:
    # Every table is the reader's to read: the console and the reports read them all.
    return Privileges("TABLE", name, worker, _READ, why)


OBJECTS: tuple[Privileges, ...] = (
    _table("agent_run", _DML, "enqueue inserts, claims, renewals and ends update, purge deletes"),
    _table(
        "agent_run_event",
        ("SELECT", "INSERT", "DELETE"),
        "steps append (never rewritten); the trigger agent_run_gone deletes a purged run's",
    ),
    _table(
        "agent_run_key",
        _DML,
        "an enqueue with a key takes or moves its row, a purge deletes its runs' rows",
    ),
    _table(
        "agent_run_failure",
        ("SELECT", "INSERT", "DELETE"),
        "failed attempts and take-backs append; the trigger agent_run_gone deletes a purged run's",
    ),
    _table(
        "agent_run_history",
        _DML,
        "the reaper moves ended runs here (agent_run_archive), a purge locks (FOR UPDATE needs "
        "UPDATE) and deletes them; a trigger refuses every rewrite (ADRs/0035)",
    ),
    _table(
        "agent_run_all",
        _READ,
        "a view: every read of a run that may have ended (ADRs/0035)",
    ),
    _table(
        "agent_run_signal",
        ("SELECT", "INSERT", "DELETE"),
        "a signal is delivered once (never rewritten), a purge deletes its runs' signals",
    ),
    _table(
        "agent_workspace",
        ("SELECT", "INSERT", "UPDATE"),
        "an enqueue's trigger adds the lane, claims fold it, a workspace is (de)activated",
    ),
    _table(
        "agent_workspace_delta",
        ("SELECT", "INSERT", "DELETE"),
        "the lanes' ledger: triggers append, every claim folds and deletes",
    ),
    _table(
        "agent_subject_head",
        _DML,
        "promoted subject heads: an end's trigger names one, its claim's deletes it, a "
        "debounce's moves it (ADRs/0036)",
    ),
    _table(
        "agent_kind",
        ("SELECT", "INSERT"),
        "an enqueue's trigger records its kind; a worker's claim reads the kinds seen",
    ),
    _table("agent_budget_hold", _DML, "budget holds are set, read and lifted"),
    _table(
        "agent_usage",
        ("SELECT", "INSERT"),
        "step boundaries record what their steps spent; kept past the runs' purge",
    ),
    _table(
        "agent_budget",
        _DML,
        "budgets are set and removed; step boundaries that report usage charge them",
    ),
    _table(
        "agent_holder",
        _DML,
        "each worker and gateway beats its row, marks it stopped, clears rows a day unseen",
    ),
    _table(
        "agent_limit",
        ("SELECT", "INSERT", "UPDATE"),
        "limits are declared, taken from and paused by every worker",
    ),
    _table("agent_sandbox", _DML, "the gateway and the sandbox reaper keep sandboxes"),
    _table(
        "agent_schedule",
        ("SELECT", "INSERT", "UPDATE"),
        "replicas sync and tick schedules (a removed one keeps its row)",
    ),
    _table("agent_schedule_tick", _DML, "a tick is claimed, given its run, pruned"),
    Privileges(
        "TABLE",
        "agent_run_watch",
        ("SELECT", "INSERT", "DELETE"),
        ("SELECT", "INSERT", "DELETE"),
        "a watcher (a worker's host or the console) adds its row and removes it (ADRs/0030); "
        "the announcing triggers read it",
    ),
    _table("alembic_version", _READ, "every process checks the schema's revision first"),
    Privileges(
        "SEQUENCE",
        "agent_run_seq",
        ("USAGE",),
        (),
        "nextval for agent_run.seq, the queue order, on every enqueue",
    ),
    Privileges(
        "SEQUENCE",
        "agent_workspace_delta_id_seq",
        ("USAGE",),
        (),
        "nextval for the ledger's bigserial key, in the triggers",
    ),
    Privileges(
        "SEQUENCE",
        "agent_run_failure_id_seq",
        (),
        (),
        "an identity column's: PostgreSQL checks no privilege on it",
    ),
    Privileges(
        "SEQUENCE",
        "agent_run_signal_id_seq",
        (),
        (),
        "an identity column's: PostgreSQL checks no privilege on it",
    ),
    Privileges(
        "FUNCTION",
        "agent_claim(timestamp with time zone, interval, text, integer, boolean)",
        ("EXECUTE",),
        (),
        "the claim",
    ),
    Privileges(
        "FUNCTION",
        "agent_subject_lock(text, text)",
        ("EXECUTE",),
        (),
        "called by the enqueue and end triggers, and by an enqueue with a policy (ADRs/0028)",
    ),
    Privileges(
        "FUNCTION",
        "agent_run_archive(integer)",
        ("EXECUTE",),
        (),
        "the reaper moves ended runs out of agent_run (ADRs/0035)",
    ),
    Privileges(
        "FUNCTION",
        "agent_lane_fold()",
        (),
        (),
        "the claim runs the fold inline; this is for an operator, as the owner",
    ),
    *(
        Privileges("FUNCTION", f"{name}()", (), (), _TRIGGER)
        for name in (
            "agent_run_enqueued",
            "agent_run_event_watched",
            "agent_run_gone",
            "agent_run_head_postponed",
            "agent_run_inserted",
            "agent_run_moved",
            "agent_run_requeued",
            "agent_run_state_watched",
            "agent_run_unhead",
            "guard_agent_run",
            "guard_agent_run_event_delete",
            "guard_agent_run_event_insert",
            "guard_agent_run_history_insert",
            "guard_agent_sandbox",
            "refuse_agent_run_delete",
            "refuse_agent_run_event_rewrite",
            "refuse_agent_run_frozen",
            "refuse_agent_run_history_rewrite",
            "refuse_agent_run_result",
            "refuse_agent_run_truncate",
            "refuse_agent_sandbox_delete",
            "refuse_agent_subject_head_write",
        )
    ),
)

# A table a later revision adds is the worker's and the reader's at once, before `db grants`
# runs again: the owner's default privileges in the schema.
_DEFAULTS: dict[Role, tuple[tuple[str, str], ...]] = {
    "worker": (("TABLES", ", ".join(_DML)), ("SEQUENCES", "USAGE"), ("FUNCTIONS", "EXECUTE")),
    "reader": (("TABLES", "SELECT"),),
}

Step = Literal["administrator", "owner"]


@dataclass(frozen=True, slots=True)
class Grant:
    """One statement of a role's grants, and who runs it: an ``administrator`` (a superuser or
    the database's owner: the database, the schema, role settings) or the schema's ``owner``
    (the objects' grants and its default privileges)."""

    sql: str
    step: Step


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def role_named(text: str) -> Role:
    """``text`` as one of :data:`ROLES`, or InvalidRequest naming them."""
    for role in ROLES:
        if text == role:
            return role
    raise InvalidRequest(f"no agentruns role {text!r}: choose {', '.join(ROLES)}")


def grants_for(url: str, role: Role, name: str) -> tuple[Grant, ...]:
    """:func:`role_grants` for the database of ``url`` and the schema its connections use."""
    parsed = make_url(url)
    database = parsed.database or parsed.username or "postgres"  # libpq's default: the user's
    return role_grants(role, name, database=database, schema=schema_of(url))


def role_grants(role: Role, name: str, *, database: str, schema: str | None) -> tuple[Grant, ...]:
    """The statements that give role ``name`` what ``role`` needs in ``database``, whose agentruns
    objects are in ``schema`` (``None``: the server's search_path, ``public``)."""
    role = role_named(role)
    if not name or len(name) > 63 or "\0" in name:
        raise InvalidRequest(f"not a PostgreSQL role name: {name!r}")
    if schema is not None:
        plain_schema(schema)
    who, where = _ident(name), _ident(schema or "public")
    admin = [Grant(f"GRANT CONNECT ON DATABASE {_ident(database)} TO {who}", "administrator")]
    if role == "owner":
        if schema is None:
            admin.append(Grant(f"GRANT USAGE, CREATE ON SCHEMA {where} TO {who}", "administrator"))
        else:
            admin.append(
                Grant(f"CREATE SCHEMA IF NOT EXISTS {where} AUTHORIZATION {who}", "administrator")
            )
            admin.append(Grant(f"ALTER SCHEMA {where} OWNER TO {who}", "administrator"))
    if schema is not None:
        admin.append(Grant(f"ALTER ROLE {who} SET search_path = {where}", "administrator"))
    if role == "owner":
        return tuple(admin)
    owner = [Grant(f"GRANT USAGE ON SCHEMA {where} TO {who}", "owner")]
    prefix = "" if schema is None else f"{where}."
    for found in OBJECTS:
        if privileges := found.of(role):
            owner.append(
                Grant(
                    f"GRANT {', '.join(privileges)} ON {found.kind} {prefix}{found.name} TO {who}",
                    "owner",
                )
            )
    for objects, granted in _DEFAULTS[role]:
        owner.append(
            Grant(
                f"ALTER DEFAULT PRIVILEGES IN SCHEMA {where} GRANT {granted} ON {objects} TO {who}",
                "owner",
            )
        )
    return (*admin, *owner)


_STEPS: dict[Step, str] = {
    "administrator": (
        "as an administrator (a superuser, or the database's owner); the search_path is for "
        "connections without the startup option, such as through a transaction pooler"
    ),
    "owner": (
        "as the schema's owner, the role that runs `agentruns db upgrade`, after it (its "
        "default privileges cover what later revisions create)"
    ),
}


def grant_script(role: Role, name: str, grants: Sequence[Grant]) -> str:
    """``grants`` as a script for psql, each step under a comment that says who runs it."""
    lines = [f"-- agentruns: the grants of the {role} role, for {name}"]
    step: Step | None = None
    for grant in grants:
        if grant.step != step:
            step = grant.step
            lines.append(f"-- {_STEPS[step]}")
        lines.append(f"{grant.sql};")
    return "\n".join(lines) + "\n"


def apply_grants(url: str, role: Role, grants: Sequence[Grant]) -> list[str]:
    """Run ``grants`` on the database at ``url`` in one transaction; the statements left for an
    administrator (empty when the connecting role could run them all).

    The owner's statements run as the objects' owner: the connecting role itself, or, for a
    superuser or a member of the owner, after ``SET ROLE`` to it, so that its default privileges
    are the owner's. A worker's or a reader's administrator statements that the connecting role
    may not run (the schema's owner is no administrator) are left out and returned; anything else
    refused is a one-line StoreUnavailable, and nothing is applied."""
    left: list[str] = []
    refusals: list[str] = []
    with connect(url) as connection:

        def warned(diag: psycopg.errors.Diagnostic) -> None:
            if diag.severity_nonlocalized == "WARNING":
                refusals.append(diag.message_primary or "")

        connection.add_notice_handler(warned)
        try:
            with connection.transaction():
                for grant in (g for g in grants if g.step == "administrator"):
                    refusals.clear()
                    try:
                        with connection.transaction():
                            connection.execute(grant.sql)
                            if refusals:  # "no privileges were granted": a warning, not an error
                                raise psycopg.errors.InsufficientPrivilege(refusals[0])
                    except psycopg.errors.InsufficientPrivilege as exc:
                        if role == "owner":
                            raise _refused(grant, exc) from exc
                        left.append(grant.sql)
                owned = [grant for grant in grants if grant.step == "owner"]
                if owned:
                    _become_owner(connection)
                for grant in owned:
                    refusals.clear()
                    try:
                        connection.execute(grant.sql)
                    except psycopg.Error as exc:
                        raise _refused(grant, exc) from exc
                    if refusals:
                        raise _refused(grant, refusals[0])
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot apply the grants: {_one_line(exc)}") from exc
    return left


def _become_owner(connection: psycopg.Connection[tuple[object, ...]]) -> None:
    """Run the rest as the owner of agentruns' objects (found by ``agent_run``)."""
    row = connection.execute(
        "SELECT pg_get_userbyid(relowner), current_user FROM pg_class "
        "WHERE oid = to_regclass('agent_run')"
    ).fetchone()
    if row is None:
        raise StoreUnavailable(
            "the database has no agentruns schema yet: run `agentruns db upgrade` as the owner "
            "first (with AGENTRUNS_SCHEMA, if it has one)"
        )
    owner, current = str(row[0]), str(row[1])
    if owner == current:
        return
    try:
        connection.execute(f"SET LOCAL ROLE {_ident(owner)}")
    except psycopg.errors.InsufficientPrivilege as exc:
        raise StoreUnavailable(
            f"{current} may not grant on agentruns' objects: apply the grants as their owner, "
            f"{owner} (the role that ran `agentruns db upgrade`), or a superuser"
        ) from exc


def _refused(grant: Grant, why: BaseException | str) -> StoreUnavailable:
    return StoreUnavailable(f"`{grant.sql}` was refused: {_one_line(why)}")


def _one_line(why: BaseException | str) -> str:
    return " ".join(str(why).split()) or type(why).__name__
