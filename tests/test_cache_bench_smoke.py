"""Smoke test of the cache benchmark: a tiny run of `python -m benchmarks.cache_bench` in
a subprocess (its own moto S3 server and local Ray) must exit 0 and write JSON in which
every epoch covers the data exactly, the cached epochs after the first fetch nothing from
the store, and the epoch read with the server stopped completes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_runs import run_benchmark
from tests.timeouts import EVENT_TIMEOUT_S

pytest.importorskip("moto.server", reason="the cache benchmark needs moto[server]")

ROWS = 16_000


@pytest.mark.slow
def test_cache_bench_tiny_run(tmp_path: Path) -> None:
    command = [
        "-m",
        "benchmarks.cache_bench",
        f"--rows={ROWS}",
        "--epochs=2",
        f"--out={tmp_path}",
        f"--epoch-timeout={EVENT_TIMEOUT_S:g}",
    ]
    done = run_benchmark(*command)
    report = json.loads((tmp_path / "cache_bench.json").read_text())
    assert report["config"]["rows"] == ROWS
    assert all(report["checks"].values()), report["checks"]
    epochs = report["epochs"]
    assert [e["config"] for e in epochs] == [
        "no cache",
        "no cache",
        "cache",
        "cache",
        "cache, server stopped",
    ]
    objects = report["sizes"]["object_bytes"]
    for epoch in epochs:
        assert epoch["coverage"]["ok"] and epoch["rows"] == ROWS, epoch
        assert epoch["rows_per_s"] > 0, epoch
    for epoch in epochs[:2]:  # uncached: at least every row group, from the store
        assert epoch["bytes_fetched"] >= report["sizes"]["row_group_bytes"], epoch
        assert epoch["cache_files"] == 0, epoch
    assert epochs[2]["bytes_fetched"] == objects and epochs[2]["cache_bytes"] == objects
    for epoch in epochs[3:]:  # later cached epochs, and the one with the server stopped
        assert epoch["bytes_fetched"] == 0 and epoch["object_gets"] == 0, epoch
        assert epoch["cache_files"] == 8 and epoch["cache_bytes"] == objects, epoch
    assert epochs[-1]["server_stopped"]
    assert report["cache_vs_no_cache_warm_time"] > 0
    assert "fetched MB" in done.stdout  # the printed table
