"""Smoke test of the decode benchmark: a tiny run of `benchmarks.decode_bench.main` (the
`python -m benchmarks.decode_bench` entry point) in this process, on the session's Ray
(a subprocess would start a whole Ray of its own and import everything again; one rank,
so fewer processes to start), must return 0, print its table and write JSON with every
loader's rows/s positive and every id delivered, and leave the session's Ray up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

LOADERS = ("torch", "rayshard_k1", "rayshard_k2", "rayshard_r2", "ray_data")


@pytest.mark.ray
@pytest.mark.slow
def test_decode_bench_tiny_run(ray_session, tmp_path: Path, capsys, monkeypatch) -> None:
    from benchmarks.decode_bench import main

    # Ray Data reads Parquet footers on a pool of up to 32 actors (one process each; on the
    # session's 4 CPUs 5 of them start, for 4 tiny files): one does the same work. Read on
    # the driver when `read_parquet` builds its file indexer.
    monkeypatch.setenv("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")

    argv = ["--samples=400", "--epochs=1", "--ranks=1", f"--data={tmp_path / 'data'}"]
    assert main([*argv, f"--out={tmp_path}"]) == 0
    printed = capsys.readouterr().out
    assert ray_session.is_initialized(), "the benchmark shut the session's Ray down"
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
    assert "loader" in printed and "rayshard_k1" in printed  # the printed table
