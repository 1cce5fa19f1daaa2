"""Run the Alembic revisions that ship with agentruns, from a checkout or an installed wheel."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine

from agentruns.adapters.postgres.database import sqlalchemy_url

_PACKAGE = Path(__file__).resolve().parents[2]  # .../agentruns


def migrations_path() -> Path:
    """``agentruns/_migrations`` in a wheel; the top-level ``migrations/`` in a checkout."""
    for candidate in (_PACKAGE / "_migrations", _PACKAGE.parents[1] / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("the agentruns migrations are missing from this installation")


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_path()))
    return config


def migrate(url: str, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` (the newest by default)."""
    _run(url, lambda config: command.upgrade(config, revision))


def downgrade(url: str, revision: str) -> None:
    """Downgrade the database at ``url`` to ``revision`` (``"base"``: an empty schema)."""
    _run(url, lambda config: command.downgrade(config, revision))


def _run(url: str, action: Callable[[Config], None]) -> None:
    engine = create_engine(sqlalchemy_url(url))  # psycopg 3 serves sync and async
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            action(config)
    finally:
        engine.dispose()
