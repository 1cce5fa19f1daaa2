"""End-to-end tests: the command line and the demo, on the embedded PostgreSQL and in memory."""

from __future__ import annotations

import logging
from collections.abc import Iterator

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
