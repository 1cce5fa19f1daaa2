"""``bench/RESULTS.md``: one file, one section per bench, each rewritten by its own run."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

ORDER = (
    "throughput",
    "depth",
    "servers",
    "steps",
    "heartbeat",
    "waits",
    "watch",
    "keys",
    "limits",
    "usage",
    "conversations",
    "purge",
    "faults",
    "console",
    "analysis",
)

HEADER = (
    "# agentruns benchmark results\n\n"
    "Each section below is written by the run it names (`make bench`, `make depth`, "
    "`make faults`); a run rewrites only its own section. See `bench/README.md` for how to "
    "read them.\n"
)


def table(title: str, started: datetime, rows: Sequence[str]) -> str:
    """A bench's section: its title, when it started and the load at its end, and its rows of
    (measure, target, measured)."""
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n".join(
        [
            title,
            "",
            f"{started:%Y-%m-%d %H:%M} UTC, embedded PostgreSQL; load average at the end {load}.",
            "",
            "| measure | target | measured |",
            "| --- | ---: | ---: |",
            *rows,
        ]
    )


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


def write_section(name: str, text: str, path: Path = RESULTS) -> None:
    """Replace section ``name`` of ``path`` with ``text``, keeping the other sections."""
    sections: dict[str, str] = {}
    existing = path.read_text() if path.exists() else ""
    for other in ORDER:
        begin, end = _markers(other)
        if begin in existing and end in existing:
            sections[other] = existing.split(begin, 1)[1].split(end, 1)[0].strip("\n")
    sections[name] = text.strip("\n")
    parts = [HEADER]
    for other in ORDER:
        if other in sections:
            begin, end = _markers(other)
            parts.append(f"{begin}\n{sections[other]}\n{end}\n")
    path.write_text("\n".join(parts))
