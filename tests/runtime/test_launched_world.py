"""A Ray driver that a launcher (torchrun, accelerate launch) started as one of several
processes, on a real local Ray: `iterator()` takes the launcher's `RANK` and `WORLD_SIZE`
(it made every such process rank 0 of 1, each reading the whole data), and refuses
`dynamic` before the rank registers (each process's own coordinator leased it the whole
epoch). Ray's workers inherit the variables of the process that started Ray: they are not
taken for a launcher's processes."""

from __future__ import annotations

import os
from collections import Counter

import pytest
import ray

from rayshard.errors import ConfigError
from rayshard.loader import Loader
from rayshard.runtime.worlds import launched_world
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, unique_name, write_parquet

pytestmark = pytest.mark.ray


@ray.remote(num_cpus=0)
def launched_in_a_worker() -> tuple | None:
    """`launched_world()` in a Ray worker with a launcher's variables (put back after)."""
    before = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE")}
    os.environ.update(RANK="1", WORLD_SIZE="2")
    try:
        return launched_world()
    finally:
        for name, value in before.items():
            os.environ.pop(name) if value is None else os.environ.update({name: value})


def test_a_launchers_process_reads_its_rank_and_is_refused_dynamic(
    ray_session, tmp_path, monkeypatch
):
    path = write_parquet(tmp_path, [40, 24])
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dynamic = Loader(
        ParquetSource(path), name=unique_name("launch"), batch_size=8, policy="dynamic"
    )
    try:
        with pytest.raises(ConfigError, match=r"RANK=1 of WORLD_SIZE=2.*inside Ray Train"):
            dynamic.iterator(batch_format="numpy")
        assert dynamic.stats()["ranks"] == []  # refused before it registered
    finally:
        dynamic.shutdown()
    static = Loader(ParquetSource(path), name=unique_name("launch"), batch_size=8, policy="data")
    try:
        it = static.iterator(batch_format="numpy")
        assert (it.placement.world_rank, it.placement.dp_size) == (1, 2)
        ids = Counter(real_ids(list(it)))
        assert len(ids) == 32 and max(ids.values()) == 1  # rank 1's half, not all 64 rows
    finally:
        static.shutdown()
    assert ray.get(launched_in_a_worker.remote()) is None
