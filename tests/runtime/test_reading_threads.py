"""How many threads read by default (`reader_threads=None`,
`rayshard.runtime.reading_threads`): the CPUs Ray assigned to the process that reads, 1
when it asked for none, its allowed CPUs outside Ray, one per CPU of an affinity mask; at
most 8. A count given by the user is used as is."""

from __future__ import annotations

import pytest
import ray

from rayshard.device import env
from rayshard.device.affinity import allowed_cpus
from rayshard.loader import Loader
from rayshard.runtime.reading_threads import (
    AUTO_READER_THREADS_MAX,
    reading_threads,
    threads_for_cpus,
)
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import epoch_and_reading_threads, unique_name, write_parquet
from tests.timeouts import EVENT_TIMEOUT_S


@pytest.mark.parametrize(
    ("cpus", "threads"), [(0, 1), (0.5, 1), (1, 1), (2, 2), (2.9, 2), (8, 8), (64, 8)]
)
def test_threads_follow_the_cpus_rounded_down_between_one_and_eight(cpus, threads):
    assert AUTO_READER_THREADS_MAX == 8
    assert threads_for_cpus(cpus) == threads


def test_a_configured_count_is_used_as_is(monkeypatch):
    monkeypatch.setenv(env.AFFINITY_MASK, str(min(allowed_cpus())))
    assert reading_threads(3) == 3


def test_outside_ray_workers_the_allowed_cpus_decide(monkeypatch):
    monkeypatch.delenv(env.AFFINITY_MASK, raising=False)
    assert reading_threads(None) == threads_for_cpus(len(allowed_cpus()))


def test_an_affinity_mask_gives_one_thread_per_cpu_it_names(monkeypatch):
    cpu = min(allowed_cpus())
    monkeypatch.setenv(env.AFFINITY_MASK, f"{cpu},{cpu},{cpu}")
    assert reading_threads(None) == 3


def test_an_affinity_mask_of_many_ids_reads_with_at_most_eight_threads(monkeypatch):
    cpu = min(allowed_cpus())
    monkeypatch.setenv(env.AFFINITY_MASK, ",".join([str(cpu)] * 12))
    assert reading_threads(None) == AUTO_READER_THREADS_MAX == 8
    assert reading_threads(12) == 12  # a configured count is still used as is


@pytest.mark.ray
@pytest.mark.parametrize(("num_cpus", "threads"), [(0, 1), (2, 2)])
def test_a_rank_in_a_ray_task_reads_with_the_cpus_the_task_asked_for(
    ray_session, tmp_path, num_cpus, threads
):
    loader = Loader(
        ParquetSource(write_parquet(tmp_path, [40, 35, 26])), batch_size=8, name=unique_name()
    )
    try:
        task = ray.remote(num_cpus=num_cpus)(epoch_and_reading_threads)
        ids, used = ray.get(task.remote(loader), timeout=EVENT_TIMEOUT_S)  # not a hang
    finally:
        loader.shutdown()
    assert used == threads
    assert sorted(ids) == list(range(101))
