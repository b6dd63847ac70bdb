"""Smoke test of the loader benchmark: a tiny run of `python -m benchmarks` in a subprocess
(it starts its own local Ray; one rank, so fewer processes to start) must write JSON with
every loader asked for, positive throughput and an exactly-once coverage check."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from benchmarks._measure import HARNESS_PROCESS, MEMORY_DUTY
from tests.benchmark_runs import run_benchmark

LOADERS = ("rayshard", "rayshard_cpus", "rayshard_dynamic", "raw")


@pytest.mark.slow
def test_loader_bench_tiny_run(tmp_path: Path) -> None:
    out = tmp_path / "loader_bench.json"
    command = [
        "-m",
        "benchmarks",
        "--rows=20000",
        f"--loaders={','.join(LOADERS)}",
        "--epochs=2",
        "--no-warmup",
        "--ray-cpus=2",
        "--ranks=1",
        "--ack-interval=0.5",
        "--split-rows=1000",  # files of 2,500 rows in one row group: pieces of a row group
        f"--data={tmp_path / 'data'}",
        f"--json={out}",
    ]
    done = run_benchmark(*command)
    report = json.loads(out.read_text())
    assert report["config"]["rows"] == 20000 and report["config"]["world_size"] == 1
    assert report["config"]["memory_duty"] == MEMORY_DUTY  # the sampler's default share
    assert report["config"]["ack_interval_s"] == 0.5
    assert report["config"]["split_rows"] == 1000
    assert set(report["results"]) == set(LOADERS)
    for name, result in report["results"].items():
        assert result["rows_per_s"] > 0, name
        assert result["coverage_ok"], (name, result["epochs"][-1]["coverage"])
        assert result["epochs"][-1]["coverage"]["rows_received"] == 20000, name
        assert result["peak_pss_mb"] > 0, name
        assert not any(p.startswith(HARNESS_PROCESS) for p in result["pss_by_process_mb"])
        assert result["steady_rows_per_s"] > 0, name
        assert len(result["pss_by_epoch_mb"]) == 2, name  # a peak, or None: not sampled
        # a sample at each epoch edge (after epoch 0, after epoch 1): every epoch sampled
        assert result["pss_edge_samples"] == 2 and result["pss_measured"], name
        assert None not in result["pss_by_epoch_mb"], name
        # the rise is over the loader's tree before its runs (its fresh Ray, for Ray's)
        assert 0 < result["idle_pss_mb"] < result["peak_pss_mb"], name
        assert result["pss_rise_mb"] == pytest.approx(result["peak_pss_mb"] - result["idle_pss_mb"])
        assert result["pss_sampler_cpu_s"] >= 0, name
        assert result["cpu_s_per_mrow"] > 0 and result["cpu_s"] > 0, name
        assert result["cpu_vs_raw"] > 0, name
        by_process = result["cpu_by_process_s"]  # the driver at least; none negative
        assert by_process and min(by_process.values()) >= 0, name
    results = report["results"]  # `dynamic` leased; the static policy has nothing to lease
    calls = results["rayshard_dynamic"]["lease_calls"]
    assert calls["calls"] > 0 and 0 <= calls["paced"] <= calls["calls"]
    assert results["rayshard"]["lease_calls"] == {"calls": 0, "paced": 0}  # static: none
    assert results["raw"]["lease_calls"] is None  # (not a rayshard loader)
    assert "rows_vs_raw" in report["targets"]
    assert report["targets"]["pss_rise_vs_raw"]["status"] in ("met", "MISSED")  # measured
    assert "pss_rise_mb" in report["definitions"]
    assert "rayshard_dynamic rows_vs_rayshard" in report["targets"]
    assert "loader" in done.stdout and "rayshard" in done.stdout  # the printed table


@pytest.mark.parametrize("bench", ["loader_bench", "decode_bench"])
def test_a_bench_rejects_an_unknown_loader(capsys, bench) -> None:
    main = importlib.import_module(f"benchmarks.{bench}").main  # in process: no interpreter

    with pytest.raises(SystemExit) as exited:
        main(["--loaders=nope"])
    assert exited.value.code == 2
    stderr = capsys.readouterr().err
    assert "--loaders" in stderr and "nope" in stderr


@pytest.mark.parametrize(
    ("argv", "needed"),
    [
        (["--loaders=ray_train", "--ray-cpus=2", "--ranks=2"], "at least 3"),
        (["--loaders=raw,rayshard_train", "--ray-cpus=1", "--ranks=2"], "at least 2"),
    ],
)
def test_the_loader_bench_refuses_too_few_cpus_for_its_train_loaders(capsys, argv, needed):
    # With fewer, `fit()` waits forever for CPUs (seen with ray_train on --ray-cpus=2).
    from benchmarks.loader_bench import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    stderr = capsys.readouterr().err
    assert "--ray-cpus" in stderr and needed in stderr


def test_the_loader_bench_refuses_a_negative_ack_interval(capsys):
    from benchmarks.loader_bench import main

    with pytest.raises(SystemExit) as exited:
        main(["--ack-interval=-1"])
    assert exited.value.code == 2
    assert "--ack-interval -1" in capsys.readouterr().err


def test_the_loader_bench_refuses_split_rows_below_one(capsys):
    from benchmarks.loader_bench import main

    with pytest.raises(SystemExit) as exited:
        main(["--split-rows=0"])
    assert exited.value.code == 2
    assert "--split-rows 0" in capsys.readouterr().err


def test_the_loader_bench_split_rows_reach_the_rayshard_loaders_source(tmp_path, monkeypatch):
    from benchmarks.loader_bench import parse_args
    from benchmarks.loaders import on_ray
    from benchmarks.loaders.data import make_dataset, parquet_files

    make_dataset(tmp_path, 4_000, files=2, row_group_size=1_000)
    monkeypatch.setattr(on_ray, "SOURCE_OPTIONS", {})
    assert parse_args(["--split-rows=300"]).split_rows == 300
    assert on_ray.rayshard_source(parquet_files(tmp_path)).split_rows is None
    on_ray.SOURCE_OPTIONS["split_rows"] = 300  # what `main` sets from --split-rows
    source = on_ray.rayshard_source(parquet_files(tmp_path))
    assert source.split_rows == 300 and len(source.splits()) == 4 * 4  # 1,000 in 300s: 4
