"""The loader benchmark's figures from a fake loader (no Ray, no processes): the PSS
rise counts what the warm-up left in the tree, every epoch gets a memory sample at its
edges however sparse the paced ones, the warm time to first batch is the median of the
warm epochs' own, steady rows/s are per rank, and PSS checks without samples say so."""

from __future__ import annotations

import time

import numpy as np
import pytest

from benchmarks import loader_bench
from benchmarks._measure import EpochRecord, epoch_windows, steady_rows_per_s

ROWS = 100
HELD: list[np.ndarray] = []  # what the fake warm-up leaves behind (as a reused worker does)


def _record(epoch: int, start: float, ttfb: float, seconds: float) -> EpochRecord:
    runs = np.array([[0, ROWS]], dtype=np.int64)
    return EpochRecord(0, epoch, start, start + ttfb, start + seconds, ROWS, 4, runs, 25)


def fake_run(ttfbs, seconds, warmup_bytes=0):
    """A one-rank loader: epoch e takes `seconds[e]`, its first batch `ttfbs[e]` in; the
    warm-up (one epoch, no `on_edge`) keeps `warmup_bytes` alive; `on_edge` runs after
    each epoch, as the harness's barrier calls it."""

    def run(paths, epochs, world=1, on_edge=None):
        if on_edge is None and epochs == 1:
            HELD.append(np.ones(warmup_bytes // 8))
        started, records = time.time(), []
        for epoch in range(epochs):
            start = time.time()
            time.sleep(seconds[epoch])
            records.append(_record(epoch, start, ttfbs[epoch], seconds[epoch]))
            if on_edge is not None:
                on_edge()
        return records, started

    return run


@pytest.fixture(autouse=True)
def _release_held():
    yield
    HELD.clear()


def test_the_pss_rise_counts_what_the_warm_up_left_in_the_tree(monkeypatch):
    run = fake_run([0.01] * 3, [0.05] * 3, warmup_bytes=200_000_000)
    monkeypatch.setitem(loader_bench.RUNNERS, "raw", run)
    result = loader_bench.measure("raw", [], ROWS, 3, warmup=True, world=1)
    # the warm-up's memory is still held in the measured run: not in a delta over the
    # tree after the warm-up, but in the rise over the tree before it
    assert result["pss_before_run_mb"] - result["idle_pss_mb"] > 150
    assert result["pss_rise_mb"] > 150


def test_every_epoch_has_a_memory_sample_however_sparse_the_paced_ones(monkeypatch):
    run = fake_run([0.01] * 4, [0.05] * 4)
    monkeypatch.setitem(loader_bench.RUNNERS, "raw", run)
    # one paced sample, then a pause of minutes: only the edge samples fall in the epochs
    result = loader_bench.measure("raw", [], ROWS, 4, warmup=False, world=1, memory_duty=1e-5)
    assert result["pss_edge_samples"] == 4
    assert result["pss_measured"]
    assert None not in result["pss_by_epoch_mb"]
    assert result["pss_samples_inside_by_epoch"][1:] == [0, 0, 0]  # (the first: maybe 1)


def test_the_warm_time_to_first_batch_is_the_median_of_the_warm_epochs(monkeypatch):
    # warm epochs' rows/s: 1000, 500, 667 (median: epoch 3, TTFB 0.09); TTFBs' median 0.02
    run = fake_run([0.01, 0.01, 0.02, 0.09], [0.05, 0.10, 0.20, 0.15])
    monkeypatch.setitem(loader_bench.RUNNERS, "raw", run)
    result = loader_bench.measure("raw", [], ROWS, 4, warmup=False, world=1)
    assert result["epoch_s"] == pytest.approx(0.15)  # rows/s: still the median epoch's
    assert result["time_to_first_batch_s"] == pytest.approx(0.02)


def test_steady_rows_per_s_count_each_rank_over_its_own_window():
    runs = np.array([[0, 1]], dtype=np.int64)
    fast = EpochRecord(0, 1, 0.0, 0.1, 1.0, 1000, 10, runs, 100)  # 900 rows in 0.9 s
    slow = EpochRecord(1, 1, 0.0, 0.9, 1.0, 200, 2, runs, 100)  # 100 rows in 0.1 s
    # not (1200 - 200) / (1.0 - 0.9): the fast rank's rows before 0.9 s are not the window's
    assert steady_rows_per_s([fast, slow]) == pytest.approx(1000 + 1000)


def test_an_edge_sample_is_one_epochs_end_and_the_next_ones_start():
    spans = [(1.0, 2.0), (2.5, 3.0), (3.5, 4.0)]
    edges = [2.2, 3.2, 4.1]
    assert epoch_windows(spans, edges) == [(1.0, 2.2), (2.2, 3.2), (3.2, 4.1)]
    assert epoch_windows(spans, []) == spans


def _result(measured: bool, peak: float, rise: float) -> dict:
    return {
        "rows_per_s": 1.0,
        "steady_rows_per_s": 1.0,
        "slowest_rank_rows_per_s": 1.0,
        "cpu_s_per_mrow": 1.0,
        "time_to_first_batch_s": 0.1,
        "cold_time_to_first_batch_s": 0.1,
        "peak_pss_mb": peak,
        "pss_rise_mb": rise,
        "pss_measured": measured,
    }


@pytest.mark.parametrize("raw_measured", [True, False])
def test_pss_checks_say_not_measured_when_an_epoch_had_no_sample(raw_measured):
    results = {"raw": _result(raw_measured, 500, 400), "rayshard": _result(False, 600, 100)}
    checks = loader_bench.add_ratios(results)
    for key in ("pss_vs_raw", "pss_rise_vs_raw"):
        assert checks[key]["met"] is None and checks[key]["value"] is None
        assert checks[key]["status"] == loader_bench.NOT_MEASURED
        assert "not measured" in loader_bench.format_check(key, checks[key])
    assert checks["rows_vs_raw"]["met"] is True  # the others are judged


def test_pss_checks_are_judged_when_every_epoch_was_sampled():
    results = {"raw": _result(True, 500, 400), "rayshard": _result(True, 600, 100)}
    checks = loader_bench.add_ratios(results)
    assert checks["pss_vs_raw"]["value"] == pytest.approx(1.2) and checks["pss_vs_raw"]["met"]
    assert checks["pss_rise_vs_raw"]["value"] == pytest.approx(0.25)
