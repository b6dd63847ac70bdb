"""The interval the coordinator asks consumers to acknowledge at (pure, no Ray)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayshard.core.ack_pacing import AckPacing


def measured(cost_s: float, calls: int = 40, **options) -> AckPacing:
    """A pacing that saw `calls` calls over 2 s, each costing `cost_s` CPU seconds."""
    pacing = AckPacing(0.1, **options)
    for n in range(calls + 1):
        pacing.called(now=2.0 * n / calls, cpu_s=cost_s * n)
    return pacing


def test_before_any_measurement_the_configured_interval_is_asked():
    pacing = AckPacing(0.1)
    assert pacing.interval_s(10_000) == 0.1
    pacing.called(now=0.0, cpu_s=5.0)
    pacing.called(now=0.5, cpu_s=5.5)  # one call, half a window: no measurement yet
    assert pacing.cost_s == 0.0
    assert pacing.interval_s(10_000) == 0.1


def test_a_window_needs_its_time_and_its_calls():
    pacing = AckPacing(0.1, window_s=1.0, min_calls=20)
    pacing.called(now=0.0, cpu_s=0.0)
    for n in range(1, 20):  # 19 calls over 3 s: too few calls
        pacing.called(now=3.0 * n / 19, cpu_s=0.001 * n)
    assert pacing.cost_s == 0.0
    pacing.called(now=3.1, cpu_s=0.020)  # the 20th
    assert pacing.cost_s == pytest.approx(0.001)
    for n in range(1, 40):  # 39 more calls within 0.5 s: too short a window
        pacing.called(now=3.1 + 0.5 * n / 40, cpu_s=0.020 + 0.002 * n)
    assert pacing.cost_s == pytest.approx(0.001)


def test_the_cost_is_smoothed_over_windows():
    pacing = measured(0.001)
    assert pacing.cost_s == pytest.approx(0.001)
    for n in range(1, 21):  # the next window: 20 calls over 1 s, 3 ms each
        pacing.called(now=2.0 + n / 20, cpu_s=0.040 + 0.003 * n)
    assert pacing.cost_s == pytest.approx(0.002)


def test_many_consumers_are_asked_to_space_out_within_the_utilization():
    pacing = measured(0.001)  # 1 ms per call, at most 80% of a core
    assert pacing.interval_s(2) == 0.1  # 2 ranks: 2.5 ms apart would do; never below 0.1
    assert pacing.interval_s(80) == pytest.approx(0.1)
    assert pacing.interval_s(1_000) == pytest.approx(1.25)
    assert pacing.interval_s(10_000) == pytest.approx(12.5)
    # what they send then: consumers / interval calls a second, each 1 ms
    assert 10_000 / pacing.interval_s(10_000) * 0.001 == pytest.approx(0.8)


def test_with_stragglers_on_no_interval_passes_a_quarter_of_the_timeout():
    # one group in flight: a rank may skip a round while its last group is queued, and
    # must still be heard from within the timeout
    settings = SimpleNamespace(ack_interval_s=0.1, straggler_timeout_s=6.0)
    pacing = AckPacing.for_settings(settings)
    assert pacing.max_interval_s == 1.5
    for n in range(41):
        pacing.called(now=n / 20, cpu_s=0.001 * n)
    assert pacing.interval_s(1_000) == pytest.approx(1.25)
    assert pacing.interval_s(10_000) == 1.5  # a healthy rank never looks silent
    off = AckPacing.for_settings(SimpleNamespace(ack_interval_s=0.1, straggler_timeout_s=None))
    assert off.max_interval_s == math.inf


def test_acknowledging_every_batch_is_never_paced():
    pacing = AckPacing(0.0)
    for n in range(41):
        pacing.called(now=n / 20, cpu_s=0.01 * n)
    assert pacing.cost_s > 0
    assert pacing.interval_s(10_000) == 0.0


@given(
    interval=st.floats(0.001, 10.0),
    most=st.floats(0.0, 100.0) | st.just(math.inf),
    cost=st.floats(0.0, 0.01),
    consumers=st.integers(0, 100_000),
    more=st.integers(0, 100_000),
)
def test_the_interval_stays_within_its_bounds_and_grows_with_the_consumers(
    interval, most, cost, consumers, more
):
    pacing = AckPacing(interval, max_interval_s=most, cost_s=cost)
    asked = pacing.interval_s(consumers)
    assert interval <= asked <= max(interval, most)
    assert pacing.interval_s(consumers + more) >= asked
    if asked < max(interval, most):  # not at its cap: the calls fit the utilization
        assert consumers * cost / asked <= pacing.utilization * (1 + 1e-9)


@pytest.mark.parametrize(
    ("mode", "cost_s", "relay"),
    [
        ("off", 0.001, False),  # never, however busy
        ("node", 0.0, False),  # always (below: True)
        ("auto", 0.0, False),  # not measured yet: the configured interval, straight
        ("auto", 0.00001, False),  # 100 consumers at 10 µs: 1.25 ms, under 0.1 s
        ("auto", 0.001, True),  # 100 consumers at 1 ms: 0.125 s, paced: relayed
    ],
)
def test_the_answer_asks_for_the_relay_by_mode_and_load(mode, cost_s, relay):
    pacing = measured(cost_s) if cost_s else AckPacing(0.1)
    answer = pacing.answer(100, mode)
    assert answer.interval_s == pacing.interval_s(100)
    assert answer.relay is (relay or mode == "node")


def test_acknowledging_every_batch_relays_only_when_asked_to():
    pacing = measured(0.001)
    pacing.ack_interval_s = 0.0
    assert pacing.answer(10_000, "auto").relay is False  # never paced
    assert pacing.answer(10_000, "node").relay is True


def test_the_cpu_clock_is_read_only_when_a_window_starts_or_ends():
    pacing, reads = AckPacing(0.1, window_s=1.0, min_calls=20), []
    for n in range(41):  # 1 ms of CPU a call, 20 calls a second: windows end at n=20, 40

        def clock(n=n) -> float:
            reads.append(n)
            return 0.001 * n

        pacing.called(now=n / 20, cpu_s=clock)
    assert reads == [0, 20, 40]  # where the windows start and end, not once a call
    assert pacing.cost_s == pytest.approx(0.001)
