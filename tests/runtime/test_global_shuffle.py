"""The streaming global shuffle on a real local Ray: an epoch covers the dataset
exactly once with each rank reading from all of it, and a mid-epoch state resumes on
another world size with nothing missing or repeated."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, run_lockstep, unique_name, write_parquet

pytestmark = [pytest.mark.ray]

ROWS = [60, 45, 75, 40, 80]  # 300 rows, row groups of 10 -> 30 splits


def test_global_shuffle_covers_every_epoch_and_resumes_on_another_world(ray_session, tmp_path):
    source = ParquetSource(write_parquet(tmp_path, ROWS, row_group_size=10))

    def make():
        return Loader(source, batch_size=8, shuffle_blocks=40, seed=5, name=unique_name("gs"))

    loader = make()
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    epoch = run_lockstep(its)
    ids = [real_ids(rank) for rank in epoch]
    assert Counter(ids[0] + ids[1]) == Counter(range(300))
    assert min(ids[0]) < 100 and max(ids[0]) >= 200  # rank 0 reads from the whole dataset
    assert ids[0] != sorted(ids[0])
    before = run_lockstep(its, steps=3)  # epoch 1, three steps in
    state = json.loads(json.dumps(its[0].state_dict()))
    received = [i for rank in before for i in real_ids(rank)]
    loader.shutdown()

    fresh = make()
    state["loader"] = fresh.loader_id  # same configuration, new name in this test
    resumed = [fresh.iterator(world_rank=r, world_size=3, batch_format="numpy") for r in range(3)]
    for it in resumed:
        it.load_state_dict(state)
    rest = [i for rank in run_lockstep(resumed) for i in real_ids(rank)]
    assert Counter(received + rest) == Counter(range(300))
    fresh.shutdown()
