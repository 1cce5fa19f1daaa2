"""The fault run, small: a few hundred runs, one worker SIGKILLed, one PostgreSQL restart; a
fifth of the runs are of a recorded-steps kind, and twenty wait for a signal delivered (and
delivered again) across the kill and the restart."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.postgres
def test_small_fault_run_loses_nothing_and_accepts_no_stale_write() -> None:
    """``python -m bench.faults --small`` exits 0: every invariant of the fault run holds."""
    env = dict(os.environ)
    # The fault run restarts its own embedded server; an external test server is used as is
    # (the run then skips the restart and says so).
    external = env.pop("AGENTRUNS_TEST_DATABASE_URL", None)
    if external:
        env["AGENTRUNS_DATABASE_URL"] = external
    else:
        env.pop("AGENTRUNS_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "bench.faults", "--small"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "fault run passed" in done.stdout
    # The recorded workload ran, was replayed, and no recorded step's function ran again.
    figures = dict(re.findall(r"^(\S.*?)\s{2,}(\S.*)$", done.stdout, re.MULTILINE))
    assert int(figures["recorded-steps runs"]) == 60
    assert int(figures["recorded steps replayed without running"]) > 0
    assert figures["recorded steps run twice"] == "0"
    # The waits workload ran to the end, each signal kept once and its answer acted on once.
    assert int(figures["waits runs"]) == 20
    assert figures["waits runs not completed"] == "0"
    assert figures["signals doubled per id / runs without one signal"] == "0 / 0"
    assert figures["wait:go recorded twice / another's / unrecorded"] == "0 / 0 / 0"
    assert figures["wait answers acted on twice"] == "0"
