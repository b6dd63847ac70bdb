"""RAYSHARD_AFFINITY_MASK: parsing, validation, and pinning real threads."""

from __future__ import annotations

import os
import threading

import pytest

from rayshard.device import (
    allowed_cpus,
    cpus_for_thread,
    env,
    parse_affinity_mask,
    pin_current_thread,
    reader_pool,
)
from rayshard.device.affinity import CAN_PIN

needs_pinning = pytest.mark.skipif(not CAN_PIN, reason="os.sched_setaffinity is Linux-only")
needs_two_cpus = pytest.mark.skipif(
    len(allowed_cpus()) < 2, reason="needs two usable CPUs to tell pinned from default"
)


def test_parses_dali_style_mask():
    assert parse_affinity_mask(" 3, 5,6,10 ", allowed={3, 5, 6, 10}) == (3, 5, 6, 10)


def test_repeated_ids_are_allowed():
    assert parse_affinity_mask("1,1", allowed={1}) == (1, 1)


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_mask_means_no_pinning(text):
    assert parse_affinity_mask(text) == ()


def test_reads_the_environment_when_no_text_given(monkeypatch):
    cpu = min(allowed_cpus())
    monkeypatch.setenv(env.AFFINITY_MASK, str(cpu))
    assert parse_affinity_mask() == (cpu,)
    monkeypatch.delenv(env.AFFINITY_MASK)
    assert parse_affinity_mask() == ()


def test_non_integer_id_is_named():
    with pytest.raises(ValueError, match="'x' is not a CPU id"):
        parse_affinity_mask("0,x", allowed={0})


@pytest.mark.parametrize("bad", ["99", "-1"])
def test_cpu_outside_the_allowed_set_is_named_with_the_variable(monkeypatch, bad):
    monkeypatch.setenv(env.AFFINITY_MASK, f"0,{bad}")
    with pytest.raises(ValueError, match=rf"RAYSHARD_AFFINITY_MASK=.*CPU {bad}.*allowed: 0-1"):
        parse_affinity_mask(allowed={0, 1})


def test_validates_against_this_process_by_default():
    impossible = max(allowed_cpus()) + 1000
    with pytest.raises(ValueError, match=f"CPU {impossible}"):
        parse_affinity_mask(f"{impossible}")


def test_thread_i_gets_the_ith_id_and_threads_beyond_keep_default():
    mask = (3, 5, 6, 10)
    default = {0, 1, 2, 3}
    assigned = [cpus_for_thread(i, mask, default) for i in range(5)]
    assert assigned == [{3}, {5}, {6}, {10}, default]


def test_threads_beyond_the_list_default_to_the_process_cpus():
    assert cpus_for_thread(1, (0,)) == allowed_cpus()


@needs_pinning
def test_pinning_applies_to_the_calling_thread_only():
    before = os.sched_getaffinity(0)
    cpu = max(before)
    seen: dict[str, set[int]] = {}

    def pinned_worker() -> None:
        pin_current_thread({cpu})
        seen["inside"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=pinned_worker)
    thread.start()
    thread.join()
    assert seen["inside"] == {cpu}
    assert os.sched_getaffinity(0) == before


def test_pinning_to_no_cpu_is_rejected():
    with pytest.raises(ValueError, match="cpus is empty"):
        pin_current_thread(set())


def _affinity_of_each_worker(pool, num_threads: int) -> dict[str, set[int]]:
    barrier = threading.Barrier(num_threads, timeout=120)

    def report() -> tuple[str, set[int]]:
        barrier.wait()  # all tasks run at once, so every worker thread exists
        return threading.current_thread().name, os.sched_getaffinity(0)

    with pool:
        return dict(f.result() for f in [pool.submit(report) for _ in range(num_threads)])


@needs_pinning
@needs_two_cpus
def test_reader_pool_pins_worker_i_and_leaves_the_rest_default():
    default = os.sched_getaffinity(0)
    cpu = max(default)
    seen = _affinity_of_each_worker(reader_pool(3, mask=(cpu,), thread_name_prefix="r"), 3)
    assert seen == {"r-0": {cpu}, "r-1": default, "r-2": default}


@needs_pinning
@needs_two_cpus
def test_reader_pool_takes_the_mask_from_the_environment(monkeypatch):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    monkeypatch.setenv(env.AFFINITY_MASK, f"{cpus[1]},{cpus[0]}")
    seen = _affinity_of_each_worker(reader_pool(2, thread_name_prefix="e"), 2)
    assert seen == {"e-0": {cpus[1]}, "e-1": {cpus[0]}}


@needs_pinning
def test_reader_pool_without_mask_pins_nothing(monkeypatch):
    monkeypatch.delenv(env.AFFINITY_MASK, raising=False)
    default = os.sched_getaffinity(0)
    seen = _affinity_of_each_worker(reader_pool(2, thread_name_prefix="n"), 2)
    assert seen == {"n-0": default, "n-1": default}


def test_reader_pool_warns_when_the_mask_is_longer_than_the_pool():
    cpu = min(allowed_cpus())
    with pytest.warns(RuntimeWarning, match="1 ids are unused"), reader_pool(1, mask=(cpu, cpu)):
        pass


@pytest.mark.parametrize("num_threads", [0, -2, 1.5])
def test_reader_pool_rejects_bad_thread_counts(num_threads):
    with pytest.raises(ValueError, match="num_threads="):
        reader_pool(num_threads)
