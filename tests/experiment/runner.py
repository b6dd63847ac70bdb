"""Runs `examples/elastic_experiment.py` on a schedule in a subprocess (its own clusters)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.timeouts import SCENARIO_TIMEOUT_S, scenario_timeout_message

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_experiment(tmp_path: Path, schedule_text: str) -> tuple[dict, str, Path]:
    """Write the schedule, run the experiment, assert it exited 0; returns its JSON result,
    its stdout and its output folder."""
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text)
    out = tmp_path / "out"
    try:
        proc = subprocess.run(
            [sys.executable, "examples/elastic_experiment.py", str(schedule), "--out", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=SCENARIO_TIMEOUT_S,
            env={**os.environ, "PYTHONPATH": REPO},
        )
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(scenario_timeout_message("elastic_experiment")) from expired
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "experiment.json").read_text()), proc.stdout, out
