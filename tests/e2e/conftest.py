"""End-to-end tests: the command line and the demo, on the embedded PostgreSQL and in memory."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Commands configure the process-wide agentruns logger; put it back after each test."""
    logger = logging.getLogger("agentruns")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A folder for an embedded server's data outside pytest's own temporary folder: as root,
    the server runs as another user, whose access to the folder's parents it grants, and another
    pytest process on the machine resets pytest's folder to its owner only (access lost)."""
    folder = Path(tempfile.mkdtemp(prefix="agentruns-e2e-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
