"""On a fresh venv: the built wheel installs with pip and the README's command-line session runs
as written (the one change: `pip install` names the wheel instead of the index's package).

The wheel is built once per test session. pip takes the dependencies from the package index, as
a user's would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path
from uuid import UUID

import pytest

from agentruns.adapters.embedded import shutdown, status

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_session() -> tuple[str, str]:
    """The README's kinds module (``# myapp/kinds.py``) and its command-line session."""
    text = README.read_text()
    section = text.split("## From the command line", 1)[1].split("\n## ", 1)[0]
    kinds = re.search(r"```python\n(# myapp/kinds\.py\n.*?)```", text, re.S)
    lines = re.search(r"```sh\n(.*?)```", section, re.S)
    assert kinds is not None, "the README lost its kinds module"
    assert lines is not None, "the README lost its command lines"
    return kinds.group(1), lines.group(1)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    [built] = out.glob("agentruns-*.whl")
    return built


def test_the_wheel_ships_the_console_files_the_migrations_and_the_schema(wheel: Path) -> None:
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    console = "agentruns/entrypoints/console"
    for template in ("base.html", "overview.html", "overview_live.html", "run.html", "runs.html"):
        assert f"{console}/templates/{template}" in names
    assert f"{console}/static/console.css" in names
    assert f"{console}/static/console.js" in names
    assert "agentruns/_migrations/versions/0009_console_indexes.py" in names
    assert "agentruns/adapters/postgres/ddl/claim.sql" in names  # today's schema, to read


def test_the_wheel_installs_and_the_readme_session_runs_as_written(
    wheel: Path, tmp_path: Path, private_dir: Path
) -> None:
    kinds, lines = readme_session()
    assert 'pip install "agentruns[embedded]"' in lines
    script = lines.replace('pip install "agentruns[embedded]"', f'pip install "{wheel}[embedded]"')
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    project = private_dir / "project"  # its .agentruns/pgdata is the embedded server's
    (project / "myapp").mkdir(parents=True)
    (project / "myapp" / "kinds.py").write_text(kinds)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AGENTRUNS_", "VIRTUAL_ENV", "PYTHON"))
    }
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        # A session that failed before its `db stop` leaves no server running.
        if status(project / ".agentruns" / "pgdata").running:
            shutdown(project / ".agentruns" / "pgdata")
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr[-5000:]}"
    # No traceback escaped: the only ones are the failed attempt's, shown by `runs show`.
    assert not any(line.startswith("Traceback") for line in done.stderr.splitlines())
    shown = out.splitlines()
    for number, line in enumerate(shown):
        if line.startswith("Traceback (most recent call last)"):
            assert shown[number - 1].startswith("Traceback of failed attempt")
    assert re.search(r"^agentruns \d+\.\d+\.\d+$", out, re.M)
    assert "(newest)" in out
    # runs list and runs show of the failed run: its error, class and traceback
    assert "ProviderError: the model is overloaded" in out
    assert "server_error" in out
    assert "Traceback of failed attempt 1" in out
    assert 'myapp/kinds.py", line' in out
    # enqueue printed its id; cancel and purge answered; the server stopped
    [enqueued] = re.findall(r"^[0-9a-f-]{36}$", out, re.M)
    assert UUID(enqueued)
    assert re.search(r"^run [0-9a-f-]{36} cancelled at epoch 1$", out, re.M)
    assert "would purge 2 runs" in out  # the completed run and the cancelled one
    assert re.search(r"^postgresql://", out, re.M)
    assert "stopped the embedded PostgreSQL" in out
    installed = subprocess.run(
        [env_dir / "bin" / "python", "-c", "import agentruns, sys; print(agentruns.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(env_dir) in installed  # the wheel's copy, not this checkout's
