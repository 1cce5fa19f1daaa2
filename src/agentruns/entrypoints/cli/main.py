"""The entry point: every command module registers itself on the application when imported."""

from __future__ import annotations

from agentruns.entrypoints.cli import (
    budgets,
    console,
    demo,
    gateway,
    inspection,
    operate,
    schedules,
)
from agentruns.entrypoints.cli.root import app

__all__ = [
    "app",
    "budgets",
    "console",
    "demo",
    "gateway",
    "inspection",
    "main",
    "operate",
    "schedules",
]


def main() -> None:
    app()
