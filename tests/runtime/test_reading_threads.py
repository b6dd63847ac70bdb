"""How many threads read by default (`reader_threads=None`,
`rayshard.runtime.reading_threads`): the CPUs Ray assigned to the process that reads, 1
when it asked for none, its allowed CPUs outside Ray (or its container CPU quota, if
fewer), one per CPU of an affinity mask; at
most 8. A count given by the user is used as is."""

from __future__ import annotations

import pytest
import ray

from rayshard.device import env
from rayshard.device.affinity import allowed_cpus
from rayshard.loader import Loader
from rayshard.runtime import cpu_quota
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


def test_outside_ray_workers_the_allowed_cpus_decide(monkeypatch, tmp_path):
    monkeypatch.delenv(env.AFFINITY_MASK, raising=False)
    monkeypatch.setattr(cpu_quota, "CGROUP_V2", tmp_path / "none")  # no quota anywhere
    monkeypatch.setattr(cpu_quota, "CGROUP_V1", (tmp_path / "none", tmp_path / "none"))
    assert reading_threads(None) == threads_for_cpus(len(allowed_cpus()))


def test_outside_ray_workers_a_container_cpu_quota_below_them_decides(monkeypatch, tmp_path):
    """A container limited to one CPU's time (cgroup v2 `cpu.max`) reads with one thread,
    however many cores its affinity shows."""
    monkeypatch.delenv(env.AFFINITY_MASK, raising=False)
    limit = tmp_path / "cpu.max"
    limit.write_text("100000 100000\n")
    monkeypatch.setattr(cpu_quota, "CGROUP_V2", limit)
    assert reading_threads(None) == 1
    limit.write_text(f"{100000 * (len(allowed_cpus()) + 4)} 100000\n")  # above: affinity
    assert reading_threads(None) == threads_for_cpus(len(allowed_cpus()))


@pytest.mark.parametrize(
    ("v2", "v1", "expected"),
    [
        ("200000 100000", None, 2.0),
        ("150000 100000\n", None, 1.5),
        ("max 100000", None, None),
        ("max", None, None),  # malformed: no quota read
        ("0 100000", None, None),
        (None, ("50000", "100000"), 0.5),
        (None, ("-1", "100000"), None),
        (None, ("x", "100000"), None),
        (None, ("100000", "0"), None),
        (None, None, None),
    ],
)
def test_the_cgroup_quota_is_read_from_v2_then_v1_files(tmp_path, v2, v1, expected):
    files = {"v2": tmp_path / "cpu.max", "quota": tmp_path / "q", "period": tmp_path / "p"}
    if v2 is not None:
        files["v2"].write_text(v2)
    if v1 is not None:
        files["quota"].write_text(v1[0])
        files["period"].write_text(v1[1])
    assert cpu_quota.cpu_quota(files["v2"], (files["quota"], files["period"])) == expected


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
