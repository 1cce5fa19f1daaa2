"""What every command relies on: durations, kinds from ``module:object``, one-line errors."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import typer

from agentruns.adapters.memory import MemorySandboxClaims
from agentruns.adapters.tokens import SigningKey
from agentruns.app.sandboxes import AgentSandboxKind
from agentruns.domain.errors import StoreUnavailable
from agentruns.entrypoints.cli.support import (
    CliError,
    guarded,
    load_kinds,
    load_sandboxes,
    parse_duration,
)
from agentruns.entrypoints.container import SandboxHosting
from agentruns.entrypoints.demo.kinds import CHAT, DIGEST, REVIEW, demo_kinds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", timedelta(days=7)),
        ("12h", timedelta(hours=12)),
        ("30m", timedelta(minutes=30)),
        ("45s", timedelta(seconds=45)),
        ("2w", timedelta(weeks=2)),
        ("90", timedelta(seconds=90)),
        ("1.5h", timedelta(minutes=90)),
    ],
)
def test_durations_read_as_operators_write_them(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "soon", "7 days", "-1d", "1y"])
def test_a_duration_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_duration(text)


@pytest.fixture
def host_module() -> Iterator[str]:
    """A host module exposing kinds in each shape the CLI accepts."""
    module = types.ModuleType("host_kinds_for_test")
    registry = demo_kinds()
    module.REGISTRY = registry  # type: ignore[attr-defined]
    module.ONE = registry.get(CHAT)  # type: ignore[attr-defined]
    module.SOME = [registry.get(REVIEW), registry.get(DIGEST)]  # type: ignore[attr-defined]
    module.build = demo_kinds  # type: ignore[attr-defined]
    module.NOT_KINDS = 42  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module.__name__
    del sys.modules[module.__name__]


@pytest.mark.parametrize(
    ("attribute", "names"),
    [
        ("REGISTRY", [CHAT, DIGEST, REVIEW]),
        ("ONE", [CHAT]),
        ("SOME", [DIGEST, REVIEW]),
        ("build", [CHAT, DIGEST, REVIEW]),
    ],
)
def test_kinds_load_from_a_registry_a_kind_a_list_or_a_factory(
    host_module: str, attribute: str, names: list[str]
) -> None:
    assert load_kinds([f"{host_module}:{attribute}"]).names() == names


def test_kinds_from_several_references_are_merged(host_module: str) -> None:
    registry = load_kinds([f"{host_module}:ONE", f"{host_module}:SOME"])
    assert registry.names() == [CHAT, DIGEST, REVIEW]


@pytest.mark.parametrize(
    ("reference", "fragment"),
    [
        ("no_colon", "module:object"),
        ("no_such_module_anywhere:KINDS", "cannot import"),
        ("{module}:MISSING", "has no 'MISSING'"),
        ("{module}:NOT_KINDS", "is not a RunKinds"),
    ],
)
def test_a_bad_kinds_reference_says_what_is_wrong(
    host_module: str, reference: str, fragment: str
) -> None:
    with pytest.raises(CliError, match=fragment):
        load_kinds([reference.format(module=host_module)])


def test_an_operator_error_becomes_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> None:
        raise StoreUnavailable("cannot reach PostgreSQL at db:5432/app:\n  connection refused")

    with pytest.raises(typer.Exit) as stopped:
        guarded(broken)
    assert stopped.value.exit_code == 1
    assert capsys.readouterr().err == (
        "agentruns: error: cannot reach PostgreSQL at db:5432/app: connection refused\n"
    )


def test_a_bug_is_not_hidden_behind_one_line() -> None:
    def buggy() -> None:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        guarded(buggy)


@pytest.fixture
def sandbox_module() -> Iterator[str]:
    """A host module exposing its sandboxes in each shape, and a few that are not."""
    module = types.ModuleType("host_sandboxes_for_test")
    key = SigningKey("k", b"k" * 32, not_after=datetime(2100, 1, 1, tzinfo=UTC))

    def hosting(*drives: str) -> SandboxHosting:
        kind = AgentSandboxKind("reviewer", runs=drives, warm_pool="pool")
        return SandboxHosting(kinds=[kind], keys=[key], claims=MemorySandboxClaims())

    def refusing() -> SandboxHosting:
        return SandboxHosting(kinds=[], keys=[key], claims=MemorySandboxClaims())

    module.HOSTING = hosting(REVIEW)  # type: ignore[attr-defined]
    module.build = lambda: hosting(REVIEW)  # type: ignore[attr-defined]
    module.STRANGER = hosting("agent.unknown")  # type: ignore[attr-defined]
    module.refusing = refusing  # type: ignore[attr-defined]
    module.NOT_HOSTING = demo_kinds()  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module.__name__
    del sys.modules[module.__name__]


@pytest.mark.parametrize("attribute", ["HOSTING", "build"])
def test_sandboxes_load_from_a_hosting_or_a_factory(sandbox_module: str, attribute: str) -> None:
    hosting = load_sandboxes(f"{sandbox_module}:{attribute}", demo_kinds())
    assert [kind.name for kind in hosting.kinds] == ["reviewer"]


@pytest.mark.parametrize(
    ("reference", "fragment"),
    [
        ("no_colon", "--sandboxes takes module:object"),
        ("no_such_module_anywhere:HOSTING", "cannot import"),
        ("{module}:MISSING", "has no 'MISSING' \\(--sandboxes"),
        ("{module}:NOT_HOSTING", "is not a SandboxHosting"),
        ("{module}:STRANGER", "run kind 'agent.unknown', which --kinds does not register"),
        ("{module}:refusing", "at least one sandbox kind"),
    ],
)
def test_a_bad_sandboxes_reference_says_what_is_wrong(
    sandbox_module: str, reference: str, fragment: str
) -> None:
    with pytest.raises(CliError, match=fragment):
        load_sandboxes(reference.format(module=sandbox_module), demo_kinds())
