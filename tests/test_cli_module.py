"""`python -m rayshard.cli` runs the `rayshard` command, as the console entry does."""

from __future__ import annotations

import subprocess
import sys


def test_python_dash_m_runs_the_rayshard_command():
    run = subprocess.run(
        [sys.executable, "-m", "rayshard.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("Usage: rayshard ") and "state" in run.stdout
