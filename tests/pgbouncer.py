"""A real PgBouncer in transaction mode in front of the test server, for the tests that check
agentruns works through one (skipped where no ``pgbouncer`` binary is installed).

Its pool holds ONE server connection per database and user, so every client shares it: a
prepared statement or a session SET of one client is met by the next, deterministically.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import make_url

from agentruns.adapters.postgres.connections import libpq_url


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def pgbouncer(server_url: str) -> Iterator[str]:
    """PgBouncer (transaction pooling, one server connection) in front of the server of
    ``server_url`` while the block runs; the URL of the same database through it."""
    binary = shutil.which("pgbouncer")
    if binary is None:
        pytest.skip("pgbouncer is not installed")
    server = make_url(libpq_url(server_url))
    socket_dir = server.query.get("host")
    host = socket_dir if isinstance(socket_dir, str) else server.host or "127.0.0.1"
    user = server.username or "postgres"
    work = Path(tempfile.mkdtemp(prefix="agentruns-pgbouncer-"))
    work.chmod(0o777)  # PgBouncer refuses to run as root: it runs as the server's user
    port = _free_port()
    (work / "users.txt").write_text(f'"{user}" "{server.password or ""}"\n')
    (work / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={server.port or 5432}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {work / 'users.txt'}\n"
        "pool_mode = transaction\n"
        "default_pool_size = 1\n"
        "max_client_conn = 200\n"
        f"logfile = {work / 'pgbouncer.log'}\n"
    )
    command = [binary]
    if os.geteuid() == 0:
        owner = os.stat(host).st_uid if os.path.isdir(host) else 65534
        command += ["-u", pwd.getpwuid(owner).pw_name]
    process = subprocess.Popen(
        [*command, str(work / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bounced = server.set(host="127.0.0.1", port=port, query={})
    url = bounced.render_as_string(hide_password=False)
    try:
        for _ in range(100):
            try:
                psycopg.connect(url, connect_timeout=1).close()
                break
            except psycopg.OperationalError:
                if process.poll() is not None:
                    log = work / "pgbouncer.log"
                    pytest.skip(f"pgbouncer did not start: {log.read_text()[-400:]}")
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(work, ignore_errors=True)
