"""Running a benchmark the way a user does, for the benchmarks' smoke tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.timeouts import SCENARIO_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent


def run_benchmark(*args: str) -> subprocess.CompletedProcess:
    """`python *args` from the repository root in a process of its own (its own local Ray,
    never the test session's: no `RAY_ADDRESS`); asserts it exited 0, showing the tail of
    its output if not."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SCENARIO_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


__all__ = ["ROOT", "run_benchmark"]
