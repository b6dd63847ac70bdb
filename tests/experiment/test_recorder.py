"""The experiment's recorder without Ray: throughput and events in seconds of the
schedule's clock whenever it started, the audit by counts, failures kept."""

from __future__ import annotations

import numpy as np

from rayshard_experiments.actors import Recorder


def test_seconds_count_from_the_schedules_start_whenever_it_is_marked():
    """The initial ranks start (and may deliver) before the schedule's clock starts: a
    batch 1.8 s before it is second 0, one 3.4 s after it second 3, not one bucket."""
    recorder = Recorder(num_samples=4)
    start = recorder._start + 10.0
    recorder.batch(0, 0, np.array([0, 1]), (start - 1.8, 2, 16, 0.1))
    recorder.event("rank_started", rank=0)
    recorder.mark_start(start)
    recorder.batch(0, 0, np.array([2, 3]), (start + 3.4, 2, 16, 0.2))
    summary = recorder.summary()
    assert [(r["second"], r["samples"], r["batches"]) for r in summary["throughput"]] == [
        (0, 2, 1),
        (3, 2, 1),
    ]
    assert summary["events"][0]["event"] == "rank_started" and summary["events"][0]["t"] < 0
    assert summary["audit"] == {0: {"seen": 4, "lost": 0, "duplicates": 0}}


def test_a_failed_rank_is_kept_with_its_error_and_the_audit_counts_repeats():
    recorder = Recorder(num_samples=3)
    recorder.ids(0, [0, 0, 1])
    recorder.event("rank_failed", rank=1, error="RuntimeError('boom')")
    assert recorder.failures() == [
        {"event": "rank_failed", "rank": 1, "error": "RuntimeError('boom')"}
    ]
    assert recorder.summary()["audit"] == {0: {"seen": 3, "lost": 1, "duplicates": 1}}
