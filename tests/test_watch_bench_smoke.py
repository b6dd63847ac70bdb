"""Smoke test of the watch benchmark: a tiny run of `python -m benchmarks.watch_bench` in a
subprocess (it starts its own two-node `ray.cluster_utils` cluster) must read every row
both ways, and count what watches the node's ranks: one `NodeWatch` and no `RankWatch`
by default, one `RankWatch` per rank process with `RAYSHARD_WATCH_BY_PID=0`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_runs import run_benchmark


@pytest.mark.slow
def test_watch_bench_tiny_run(tmp_path: Path) -> None:
    out = tmp_path / "watch_bench.json"
    command = ["-m", "benchmarks.watch_bench", "--ranks=2", "--rows=20000"]
    command += [f"--data={tmp_path / 'data'}", f"--json={out}"]
    run_benchmark(*command)
    results = {r["way"]: r for r in json.loads(out.read_text())["results"]}
    by_node, by_rank = results["node_watch"], results["rank_watch"]
    assert by_node["coverage_ok"] and by_rank["coverage_ok"]
    watches = ("node_watches", "rank_watches", "watched_by_pid", "watch_processes")
    assert tuple(by_node[k] for k in watches) == (1, 0, 2, 1)
    assert tuple(by_rank[k] for k in watches) == (0, 2, 0, 2)
    assert 0 < by_node["watch_pss_mb"] < by_rank["watch_pss_mb"]
    for result in (by_node, by_rank):  # each rank timed: the slowest is at least the median
        for timed in ("iterator", "first_batch"):
            assert result[f"{timed}_median_s"] <= result[f"{timed}_max_s"]
