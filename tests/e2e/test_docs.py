"""Every Python block of README.md and docs/*.md runs as written, in a fresh folder per document.

How a document's fenced blocks are played, in order (a reader following the page does the same):

- a ``python`` or ``toml`` block whose first line is ``# some/path.py`` (or ``.toml``) is that
  file of the reader's project: it is written there, and every such Python module must import;
- any other ``python`` block is a script: it runs with ``python`` and must exit 0; a ``text``
  block right after it is its standard output, exactly;
- a ``sh`` block with ``$ `` lines is a terminal session: each command runs with bash in the
  folder and must exit 0, and the lines after it are what its standard output shows, in order
  (``...`` at a line's end stands for the rest of it). A command ending in ``&`` keeps running
  in the background (a worker) until the document ends, when it gets SIGINT and must stop
  cleanly; while one runs, a command whose output does not match yet is tried again for a while.
  ``sh`` blocks without ``$ `` lines are reference, not run.

No database URL is set: the blocks run on the embedded PostgreSQL in the folder's
``.agentruns/pgdata``, as a reader's would; a test session's server is used if
``AGENTRUNS_TEST_DATABASE_URL`` names one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FILE_HEADER = re.compile(r"^# ([\w./-]+\.(?:py|toml))\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
RETRY_FOR = 90.0  # seconds a command may take to show its output while a worker runs


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int

    @property
    def file(self) -> str | None:
        first = self.text.splitlines()[0] if self.text else ""
        match = FILE_HEADER.match(first)
        return match[1] if match else None


def blocks_of(document: Path) -> list[Block]:
    found: list[Block] = []
    language: str | None = None
    lines: list[str] = []
    start = 0
    for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if fence and language is None:
            language, lines, start = fence[1] or "text", [], number
        elif line.strip() == "```" and language is not None:
            found.append(Block(language, "\n".join(lines) + "\n", start))
            language = None
        elif language is not None:
            lines.append(line)
    assert language is None, f"{document.name}: a block opened on line {start} never closes"
    return found


def _matches(expected: str, actual: str) -> bool:
    expected, actual = " ".join(expected.split()), " ".join(actual.split())
    if expected.endswith(" ..."):
        return actual.startswith(expected[: -len("...")])
    return expected == actual


def _shows(expected: list[str], output: str) -> bool:
    """Every expected line, in order, among the output's lines."""
    lines = iter(output.splitlines())
    return all(any(_matches(want, line) for line in lines) for want in expected)


class Reader:
    """Plays one document's blocks in a folder of its own."""

    def __init__(self, document: Path, folder: Path) -> None:
        self.document = document
        self.folder = folder
        self.modules: list[str] = []
        self.background: list[tuple[str, subprocess.Popen[str]]] = []
        self.env = dict(os.environ)
        self.env.pop("AGENTRUNS_DATABASE_URL", None)
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"

    def where(self, block: Block) -> str:
        return f"{self.document.name}, block at line {block.line}"

    def run(self, command: list[str], block: Block) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            command,
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            f"{self.where(block)}: {' '.join(command)} exited {done.returncode}\n"
            f"{done.stdout}\n{done.stderr}"
        )
        return done

    def write(self, block: Block, path: str) -> None:
        target = self.folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text, encoding="utf-8")
        if path.endswith(".py") and not Path(path).name.startswith("test_"):
            self.modules.append(path.removesuffix(".py").replace("/", "."))

    def script(self, block: Block, output: Block | None) -> None:
        path = self.folder / f"block_{block.line}.py"
        path.write_text(block.text, encoding="utf-8")
        done = self.run([sys.executable, path.name], block)
        if output is not None:
            assert done.stdout == output.text, f"{self.where(block)} printed:\n{done.stdout}"

    def session(self, block: Block) -> None:
        commands: list[tuple[str, list[str]]] = []
        for line in block.text.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:].strip(), []))
            elif commands:
                commands[-1][1].append(line)
        for command, expected in commands:
            if command.endswith("&"):
                self.start(command.removesuffix("&").strip())
            else:
                self.command(command, [line for line in expected if line.strip()], block)

    def start(self, command: str) -> None:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=self.folder,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.background.append((command, process))

    def command(self, command: str, expected: list[str], block: Block) -> None:
        deadline = time.monotonic() + (RETRY_FOR if self.background else 0)
        while True:
            done = self.run(["bash", "-c", command], block)
            if _shows(expected, done.stdout):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.where(block)}: `{command}` printed:\n{done.stdout}")
            for started, process in self.background:
                assert process.poll() is None, f"`{started}` stopped: {process.communicate()}"
            time.sleep(0.5)

    def stop(self) -> None:
        for command, process in self.background:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
            try:
                _, err = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                _, err = process.communicate()
            assert process.returncode == 0, f"`{command}` exited {process.returncode}:\n{err}"
        self.background = []

    def play(self) -> int:
        """Play every block; how many ran."""
        blocks = blocks_of(self.document)
        played = 0
        try:
            for index, block in enumerate(blocks):
                after = blocks[index + 1] if index + 1 < len(blocks) else None
                output = after if after is not None and after.language == "text" else None
                if block.language in ("python", "toml") and block.file is not None:
                    self.write(block, block.file)
                elif block.language == "python":
                    self.script(block, output)
                elif block.language == "sh" and "\n$ " in f"\n{block.text}":
                    self.session(block)
                else:
                    continue
                played += 1
        finally:
            self.stop()
        for module in self.modules:
            self.run([sys.executable, "-c", f"import {module}"], Block("python", module, 0))
        return played


@pytest.mark.postgres
@pytest.mark.parametrize("document", DOCUMENTS, ids=[path.name for path in DOCUMENTS])
def test_every_python_block_runs_as_written(document: Path, tmp_path: Path) -> None:
    python_blocks = [block for block in blocks_of(document) if block.language == "python"]
    played = Reader(document, tmp_path).play()
    assert played >= len(python_blocks)


def test_the_quickstart_is_short_and_starts_from_nothing() -> None:
    """At most about twenty lines, on the embedded server, with an asyncio.run entry."""
    quickstart = next(
        block
        for block in blocks_of(REPO / "README.md")
        if block.language == "python" and block.file is None
    )
    assert len(quickstart.text.splitlines()) <= 21
    assert "asyncio.run(main())" in quickstart.text
    assert "agentruns.connect(kinds=" in quickstart.text  # no URL: the embedded server


def test_the_readme_pytest_configuration_is_clean(tmp_path: Path) -> None:
    """The README's ``pyproject.toml`` for the kit gives pytest-asyncio everything it asks for:
    its two-line form left the fixture loop scope unset, a deprecation warning on every run
    (printed at configure time, so the session's ``4 passed`` line did not show it)."""
    [config] = [block for block in blocks_of(REPO / "README.md") if block.file == "pyproject.toml"]
    (tmp_path / "pyproject.toml").write_text(config.text, encoding="utf-8")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_kit.py").write_text(
        "from agentruns.testing import HarnessFactory\n\n\n"
        "async def test_a_harness(agentruns_harness: HarnessFactory) -> None:\n"
        "    assert agentruns_harness() is not None\n",
        encoding="utf-8",
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "memory"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
