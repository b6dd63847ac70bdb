"""The loader benchmark's memory figures: a sampler paced to a share of one core, and
per-epoch peaks that say when an epoch had no sample rather than reporting 0."""

from __future__ import annotations

import pytest

from benchmarks._measure import MEMORY_DUTY, PeakPss, growth, pause_after, peak_between
from tests.timeouts import wait_until


@pytest.mark.parametrize("cost", [0.001, 0.01, 0.04, 0.2])
@pytest.mark.parametrize("duty", [MEMORY_DUTY, 0.2, 1.0])
def test_the_sampler_uses_at_most_its_share_of_a_core(cost, duty):
    pause = pause_after(cost, 0.1, duty)
    assert pause >= 0.1
    assert cost / (cost + pause) <= duty + 1e-12
    if cost / duty - cost > 0.1:  # no longer a wait than the share asks for
        assert cost / (cost + pause) == pytest.approx(duty)


def test_an_epoch_without_a_sample_has_no_peak_and_growth_skips_it():
    series = [(1.0, 100), (2.5, 300), (2.7, 250), (5.0, 120)]
    assert peak_between(series, 2.0, 3.0) == 300
    assert peak_between(series, 3.0, 4.9) is None  # nothing sampled: not a peak of 0
    assert growth([None, 250.0, None, 260.0, None]) == 10.0
    assert growth([None, 250.0, None]) is None
    assert growth([]) is None


def test_the_sampler_reports_its_own_cpu_time():
    with PeakPss(interval_s=0.0, max_duty=1.0) as memory:
        wait_until(lambda: memory.samples >= 3, "three PSS samples", poll=0.01)
    assert memory.peak > 0 and memory.cpu_s > 0
