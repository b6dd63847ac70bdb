"""Smoke test of the decode benchmark: a tiny run of `python -m benchmarks.decode_bench` in a
subprocess (it starts its own local Ray; one rank, so fewer processes to start) must exit 0
and write JSON with every loader's rows/s positive and every id delivered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timeouts import SCENARIO_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
LOADERS = ("torch", "rayshard_k1", "rayshard_k2", "rayshard_r2", "ray_data")


@pytest.mark.slow
def test_decode_bench_tiny_run(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("RAY_ADDRESS", None)
    command = [
        sys.executable,
        "-m",
        "benchmarks.decode_bench",
        "--samples=400",
        "--epochs=1",
        "--ranks=1",
        f"--data={tmp_path / 'data'}",
        f"--out={tmp_path}",
    ]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "decode_bench.json").read_text())
    assert report["config"]["samples"] == 400 and report["config"]["world_size"] == 1
    assert set(report["results"]) == set(LOADERS)
    for name, result in report["results"].items():
        assert result["rows_per_s"] > 0, name
        assert result["coverage_ok"], (name, result["epochs"])
    assert set(report["ratios"]) == {
        "rayshard_vs_torch",
        "rayshard_vs_ray_data",
        "rayshard_k2_vs_k1",
        "rayshard_r2_vs_k1",
    }
    assert "rayshard_vs_torch" in report["targets"]
    assert "loader" in done.stdout and "rayshard_k1" in done.stdout  # the printed table
