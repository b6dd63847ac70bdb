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
    monkeypatch.setattr(cpu_quota, "ROOT", tmp_path)  # no quota anywhere
    assert reading_threads(None) == threads_for_cpus(len(allowed_cpus()))


def test_outside_ray_workers_a_container_cpu_quota_below_them_decides(monkeypatch, tmp_path):
    """A container limited to one CPU's time (cgroup v2 `cpu.max`) reads with one thread,
    however many cores its affinity shows."""
    monkeypatch.delenv(env.AFFINITY_MASK, raising=False)
    monkeypatch.setattr(cpu_quota, "ROOT", tmp_path)
    monkeypatch.setattr(cpu_quota, "MEMBERSHIP", tmp_path / "no such file")  # its root
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert reading_threads(None) == 1
    (tmp_path / "cpu.max").write_text(f"{100000 * (len(allowed_cpus()) + 4)} 100000\n")
    assert reading_threads(None) == threads_for_cpus(len(allowed_cpus()))


def _cgroups(root, files: dict[str, str], membership: str):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "membership").write_text(membership)
    return cpu_quota.cpu_quota(root, root / "membership")


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "200000 100000"}, 2.0),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000"}, None),
        ({"cpu.max": "max"}, None),  # malformed: no quota read
        ({"cpu.max": "0 100000"}, None),
        ({"cpu/cpu.cfs_quota_us": "50000", "cpu/cpu.cfs_period_us": "100000"}, 0.5),
        ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        ({"cpu/cpu.cfs_quota_us": "x", "cpu/cpu.cfs_period_us": "100000"}, None),
        ({"cpu/cpu.cfs_quota_us": "100000", "cpu/cpu.cfs_period_us": "0"}, None),
        ({}, None),
    ],
)
def test_the_cgroup_quota_is_read_from_v2_then_v1_files(tmp_path, files, expected):
    assert _cgroups(tmp_path, files, "0::/\n1:cpu,cpuacct:/\n") == expected


def test_the_lowest_quota_on_the_way_from_the_process_cgroup_to_the_root_counts(tmp_path):
    """Without a cgroup namespace the mount's root is the host's: the process's own cgroup
    (from its membership) and each parent are read, v2 and v1 alike."""
    v2 = {"cpu.max": "max 100000", "job/cpu.max": "400000 100000"}
    v2["job/step/cpu.max"] = "max 100000"
    assert _cgroups(tmp_path / "v2", v2, "0::/job/step\n") == 4.0
    v1 = {
        f"cpu/{where}cpu.cfs_quota_us": quota
        for where, quota in [("", "-1"), ("pod/", "300000"), ("pod/box/", "500000")]
    }
    v1.update({name.replace("quota", "period"): "100000" for name in v1})
    assert _cgroups(tmp_path / "v1", v1, "3:cpu,cpuacct:/pod/box\n0::/\n") == 3.0
    # membership unreadable: the root alone counts, and it sets no quota
    assert _cgroups(tmp_path / "unknown", v1, "garbage\n") is None


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
