"""The domain reads no clock and draws no global randomness: checked on its source."""

from __future__ import annotations

import ast
from pathlib import Path

import agentruns.domain

DOMAIN = Path(agentruns.domain.__file__).parent
FORBIDDEN_CALLS = {
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
    ("time", "time"),
    ("time", "monotonic"),
    ("time", "perf_counter"),
    ("time", "sleep"),
    ("uuid", "uuid4"),
    ("os", "urandom"),
}
FORBIDDEN_MODULES = {"random", "secrets", "os", "socket", "asyncio", "subprocess", "pathlib"}


def _domain_sources() -> list[Path]:
    return sorted(DOMAIN.rglob("*.py"))


def _attribute_calls(tree: ast.AST) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            found.add((node.value.id, node.attr))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            found.add((node.value.attr, node.attr))
    return found


def _imported_modules(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_the_domain_reads_no_clock_and_draws_no_global_randomness() -> None:
    """No domain module calls a clock, sleeps or draws an id or number of its own."""
    offenders = {
        str(path.relative_to(DOMAIN)): sorted(_attribute_calls(ast.parse(path.read_text())))
        for path in _domain_sources()
    }
    offenders = {
        name: [call for call in calls if tuple(call) in FORBIDDEN_CALLS]
        for name, calls in offenders.items()
    }
    assert {name: calls for name, calls in offenders.items() if calls} == {}


def test_the_domain_imports_no_io_or_randomness_module() -> None:
    """No domain module imports random, os, sockets, asyncio or the file system."""
    imports = {
        str(path.relative_to(DOMAIN)): _imported_modules(ast.parse(path.read_text()))
        & FORBIDDEN_MODULES
        for path in _domain_sources()
    }
    assert {name: found for name, found in imports.items() if found} == {}


def test_the_purity_check_sees_a_clock_read() -> None:
    """The source check is not vacuous: it finds a clock read where there is one."""
    tree = ast.parse("from datetime import datetime\nx = datetime.now()\nimport random\n")
    assert ("datetime", "now") in _attribute_calls(tree)
    assert "random" in _imported_modules(tree)
