"""Smoke test: the device-feed benchmark runs on the CPU and writes complete JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_feed.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("gpu_feed_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_benchmark_on_cpu_writes_every_number(tmp_path, capsys):
    out = tmp_path / "gpu_feed.json"
    returned = load_benchmark().main(["--quick", "--device", "cpu", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result == json.loads(json.dumps(returned))
    assert result["device"] == "cpu"
    bandwidth, stall, memory = result["bandwidth"], result["stall"], result["memory"]
    for key in ("feed_gbps", "feed_gbps_fresh_pool", "baseline_gbps", "ratio"):
        assert bandwidth[key] > 0, key
    assert bandwidth["baseline"] == "plain copy"
    assert stall["wall_seconds"] > 0 and 0 <= stall["stall_fraction"] < 1
    assert stall["stall_seconds"] >= 0
    if memory["supported"]:
        assert memory["batch_bytes"] == result["config"]["batch_bytes"] > 0
        # >= 0: on the CPU the feed hands out views and may allocate nothing per batch
        assert memory["peak_rss_delta_bytes"] >= 0 and memory["bound_bytes"] > 0
    table = capsys.readouterr().out
    assert "bandwidth ratio" in table and "stall fraction" in table
