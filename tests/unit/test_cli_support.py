"""What every command relies on: durations, kinds from ``module:object``, one-line errors."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer

from agentruns.adapters.memory import MemorySandboxClaims
from agentruns.adapters.tokens import SigningKey
from agentruns.app.sandboxes import AgentSandboxKind
from agentruns.domain.errors import StoreUnavailable
from agentruns.entrypoints.cli.support import (
    CliError,
    duration,
    guarded,
    load_kinds,
    load_sandboxes,
    moment,
    port,
)
from agentruns.entrypoints.container import SandboxHosting
from agentruns.entrypoints.demo.kinds import CHAT, DIGEST, REVIEW, demo_kinds


@pytest.mark.parametrize(
    ("text", "expected"),
    [("7d", timedelta(days=7)), ("90", timedelta(seconds=90)), ("1h30m", timedelta(minutes=90))],
)
def test_durations_read_as_operators_write_them(text: str, expected: timedelta) -> None:
    assert duration(text, "--older-than") == expected


@pytest.mark.parametrize("text", ["", "soon", "7 days", "-1d", "1y", "999999999d"])
def test_a_duration_that_is_not_one_is_one_line_naming_the_option(text: str) -> None:
    with pytest.raises(CliError, match=r"^--older-than: "):
        duration(text, "--older-than")


def test_a_time_is_a_duration_from_now_or_an_iso_time_with_its_zone() -> None:
    now = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
    assert moment("10m", "--due", now) == now + timedelta(minutes=10)
    assert moment("2026-05-02T10:00:00Z", "--due", now) == datetime(2026, 5, 2, 10, tzinfo=UTC)
    with pytest.raises(CliError, match="no time zone"):
        moment("2026-05-02T10:00:00", "--due", now)
    with pytest.raises(CliError, match="neither a duration"):
        moment("tomorrow", "--due", now)


@pytest.mark.parametrize("value", [-1, 65536, 70000])
def test_a_port_out_of_range_is_one_line(value: int) -> None:
    with pytest.raises(CliError, match="is not a port"):
        port(value, "--metrics-port")
    assert port(0, "--metrics-port") == 0


def test_the_current_folder_is_importable_for_kinds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``python -m`` and uvicorn do: ``--kinds myapp.kinds:KINDS`` from the project folder."""
    package = tmp_path / "myapp_here_for_test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kinds.py").write_text(
        "from agentruns.entrypoints.demo.kinds import demo_kinds\nKINDS = demo_kinds()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", ".")])
    assert load_kinds(["myapp_here_for_test.kinds:KINDS"]).names() == [CHAT, DIGEST, REVIEW]
    sys.modules.pop("myapp_here_for_test.kinds", None)
    sys.modules.pop("myapp_here_for_test", None)


def test_a_module_that_fails_to_import_is_one_line_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_kinds_for_test.py").write_text("KINDS = [\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CliError, match="SyntaxError"):
        load_kinds(["broken_kinds_for_test:KINDS"])
    (tmp_path / "raising_kinds_for_test.py").write_text("raise RuntimeError('no key')\n")
    with pytest.raises(CliError, match="RuntimeError: no key"):
        load_kinds(["raising_kinds_for_test:KINDS"])


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
