"""HostBufferPool: reuse, growth, growth factor, shrink threshold, presizing, statistics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.device import HostBufferPool, env

SIZES = st.integers(min_value=0, max_value=1 << 16)


def ordinary_pool(**kwargs) -> HostBufferPool:
    return HostBufferPool(pinned=False, **kwargs)


def test_released_buffer_is_reused_not_reallocated():
    pool = ordinary_pool(shrink_threshold=0.0)
    first = pool.acquire(1000)
    pool.release(first)
    second = pool.acquire(800)
    assert second.data_ptr() == first.data_ptr()
    stats = pool.stats()
    assert (stats.num_buffers, stats.allocations, stats.reallocations) == (1, 1, 0)


def test_buffers_held_at_once_each_get_their_own_memory():
    pool = ordinary_pool()
    a, b = pool.acquire(100), pool.acquire(100)
    assert a.data_ptr() != b.data_ptr()
    assert pool.stats().in_use == 2


def test_too_small_buffer_grows_in_place_of_the_old_one():
    pool = ordinary_pool()
    pool.release(pool.acquire(100))
    grown = pool.acquire(300)
    assert grown.numel() == 300
    stats = pool.stats()
    assert (stats.num_buffers, stats.pool_bytes, stats.reallocations) == (1, 300, 1)


def test_growth_factor_over_allocates_and_then_absorbs_smaller_growth():
    pool = ordinary_pool(growth_factor=1.5, shrink_threshold=0.0)
    buffer = pool.acquire(1000)
    assert buffer.numel() == 1500
    pool.release(buffer)
    assert pool.acquire(1400).numel() == 1500
    assert pool.stats().reallocations == 0


def test_shrink_threshold_shrinks_only_below_the_fraction():
    pool = ordinary_pool(shrink_threshold=0.9)
    pool.release(pool.acquire(100))
    kept = pool.acquire(90)  # 90 is not below 0.9 * 100
    assert kept.numel() == 100
    pool.release(kept)
    shrunk = pool.acquire(89)
    assert shrunk.numel() == 89
    assert pool.stats().reallocations == 1


@pytest.mark.parametrize(("threshold", "request_size", "capacity"), [(0.0, 1, 100), (1.0, 99, 99)])
def test_shrink_threshold_extremes_never_and_always(threshold, request_size, capacity):
    pool = ordinary_pool(shrink_threshold=threshold)
    pool.release(pool.acquire(100))
    assert pool.acquire(request_size).numel() == capacity


def test_presize_from_bytes_per_sample_hint_avoids_allocations():
    pool = ordinary_pool(shrink_threshold=0.0)
    pool.presize(bytes_per_sample_hint=64, batch_size=32, count=3)
    stats = pool.stats()
    assert (stats.num_buffers, stats.pool_bytes, stats.allocations) == (3, 3 * 2048, 3)
    held = [pool.acquire(2048, num_samples=32) for _ in range(3)]
    assert all(b.numel() == 2048 for b in held)
    stats = pool.stats()
    assert (stats.allocations, stats.reallocations, stats.in_use) == (3, 0, 3)


def test_presize_grows_small_free_buffers_and_keeps_big_ones():
    pool = ordinary_pool(shrink_threshold=0.0)
    for buffer in [pool.acquire(10_000), pool.acquire(10)]:
        pool.release(buffer)
    pool.presize(bytes_per_sample_hint=10, batch_size=100, count=2)
    stats = pool.stats()
    assert (stats.num_buffers, stats.pool_bytes, stats.reallocations) == (2, 11_000, 1)


def test_stats_report_the_hint_to_use_next_time():
    pool = ordinary_pool()
    for nbytes, samples in [(4096, 32), (10_000, 32), (500, 4)]:
        pool.release(pool.acquire(nbytes, num_samples=samples))
    stats = pool.stats()
    assert stats.largest_batch_bytes == 10_000
    assert stats.max_bytes_per_sample == math.ceil(10_000 / 32)
    assert stats.in_use == 0


def test_release_rejects_foreign_and_double_release():
    pool = ordinary_pool()
    with pytest.raises(ValueError, match="did not hand out"):
        pool.release(torch.empty(10, dtype=torch.uint8))
    buffer = pool.acquire(10)
    pool.release(buffer)
    with pytest.raises(ValueError, match="already"):
        pool.release(buffer)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
@pytest.mark.filterwarnings("ignore:pinned=True but CUDA is not available")
def test_asking_for_pinned_memory_on_cpu_only_torch_falls_back_without_raising():
    pool = HostBufferPool(pinned=True)
    assert pool.pinned is False
    assert pool.acquire(16).numel() == 16
    assert HostBufferPool().pinned is False


@pytest.mark.parametrize("factor", [0.5, 0.0, -1, float("inf"), float("nan"), "x", True])
def test_bad_growth_factor_names_the_value_and_the_rule(factor):
    with pytest.raises(ValueError, match="growth_factor="):
        ordinary_pool(growth_factor=factor)


@pytest.mark.parametrize("threshold", [-0.1, 1.5, "half"])
def test_bad_shrink_threshold_names_the_value_and_the_range(threshold):
    with pytest.raises(ValueError, match="shrink_threshold="):
        ordinary_pool(shrink_threshold=threshold)


@pytest.mark.parametrize(("name", "value"), [("batch_size", -1), ("count", 1.5)])
def test_bad_presize_arguments_are_named(name, value):
    arguments = {"bytes_per_sample_hint": 8, "batch_size": 4, "count": 1, name: value}
    with pytest.raises(ValueError, match=name):
        ordinary_pool().presize(**arguments)


def test_environment_sets_growth_factor_host_name_first(monkeypatch):
    monkeypatch.setenv(env.GROWTH_FACTOR, "3")
    assert ordinary_pool().growth_factor == 3.0
    monkeypatch.setenv(env.HOST_GROWTH_FACTOR, "2")
    assert ordinary_pool().growth_factor == 2.0
    assert ordinary_pool(growth_factor=1.25).growth_factor == 1.25  # argument wins


def test_environment_sets_shrink_threshold(monkeypatch):
    monkeypatch.setenv(env.HOST_SHRINK_THRESHOLD, "0.5")
    pool = ordinary_pool()
    assert pool.shrink_threshold == 0.5
    pool.release(pool.acquire(100))
    assert pool.acquire(51).numel() == 100


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (env.HOST_GROWTH_FACTOR, "0.9"),
        (env.GROWTH_FACTOR, "fast"),
        (env.HOST_SHRINK_THRESHOLD, "2"),
    ],
)
def test_bad_environment_value_names_the_variable(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        ordinary_pool()


def test_defaults_when_environment_is_unset(monkeypatch):
    for variable in env.DEVICE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    pool = ordinary_pool()
    assert (pool.growth_factor, pool.shrink_threshold) == (1.0, 0.9)


@settings(max_examples=200, deadline=None)
@given(
    requests=st.lists(SIZES, min_size=1, max_size=30),
    factor=st.sampled_from([1.0, 1.1, 1.5, 2.0]),
    threshold=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
)
def test_single_buffer_follows_the_grow_and_shrink_rules(requests, factor, threshold):
    pool = ordinary_pool(growth_factor=factor, shrink_threshold=threshold)
    capacity, reallocations = None, 0
    for nbytes in requests:
        buffer = pool.acquire(nbytes)
        assert buffer.numel() >= nbytes
        if capacity is None:
            assert buffer.numel() == max(nbytes, math.ceil(nbytes * factor))
        elif nbytes > capacity:
            assert buffer.numel() == max(nbytes, math.ceil(nbytes * factor))
            reallocations += 1
        elif nbytes < threshold * capacity:
            assert buffer.numel() == nbytes
            reallocations += 1
        else:
            assert buffer.numel() == capacity
        if threshold == 0.0 and capacity is not None:
            assert buffer.numel() >= capacity  # without shrinking, buffers only grow
        capacity = buffer.numel()
        pool.release(buffer)
    stats = pool.stats()
    assert (stats.num_buffers, stats.pool_bytes) == (1, capacity)
    assert stats.reallocations == reallocations
    assert stats.largest_batch_bytes == max(requests)


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(SIZES, min_size=1, max_size=8), data=st.data())
def test_a_repeated_batch_pattern_allocates_nothing_new(sizes, data):
    pool = ordinary_pool(shrink_threshold=0.0)
    for buffer in [pool.acquire(n) for n in sizes]:
        pool.release(buffer)
    before = pool.stats()
    assert before.num_buffers == len(sizes) and before.pool_bytes == sum(sizes)
    again = data.draw(st.permutations(sizes))
    held = [pool.acquire(n) for n in again]
    assert all(b.numel() >= n for b, n in zip(held, again, strict=True))
    after = pool.stats()
    assert (after.allocations, after.reallocations) == (before.allocations, 0)
    assert after.pool_bytes == before.pool_bytes


def test_power_of_two_ceil_is_the_smallest_power_of_two_not_below():
    from rayshard.device.pinned_pool import _power_of_two_ceil

    assert _power_of_two_ceil(0) == 0
    for nbytes in range(1, 5000):
        rounded = _power_of_two_ceil(nbytes)
        assert rounded >= nbytes and rounded & (rounded - 1) == 0
        assert rounded == 1 or rounded // 2 < nbytes


def test_ordinary_buffers_are_not_rounded():
    pool = HostBufferPool(pinned=False, growth_factor=1.0)
    assert pool.acquire(3000).numel() == 3000
