"""A loop that goes back to the same checkpoint twice (a rewind after a loss spike, a
group restored from its latest checkpoint a second time, `fit(ckpt_path=...)` run again)
reads the rest of that checkpoint's epoch each time; the ranks of one restore join it
(the peers' loads of the same state start no new generation). Real Ray, real Parquet."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import run_lockstep, unique_name, write_parquet

pytestmark = [pytest.mark.ray]

ROWS = [40, 35, 26]  # 101 rows, row groups of 7


def _ids(batches) -> list[int]:
    return [int(i) for b in batches for i in b["_index"]]


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_a_rewind_to_the_same_checkpoint_twice_reads_its_rest_each_time(
    ray_session, tmp_path, policy
):
    source = ParquetSource(write_parquet(tmp_path, ROWS))
    loader = Loader(
        source, batch_size=8, shuffle=True, seed=5, policy=policy, name=unique_name("rewind")
    )
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    try:
        first = _ids(itertools.islice(it, 3))
        checkpoint = it.state_dict()
        _ids(itertools.islice(it, 4))  # trained on, then diverged: back to the checkpoint
        rests: list[list[int]] = []
        for _ in range(3):
            it.load_state_dict(checkpoint)
            assert it.epoch == 0
            two = _ids(itertools.islice(it, 2))
            saved = it.state_dict()  # the checkpoint's samples and these two batches only
            assert sum(b - a for a, b in saved["consumed"]) == len(first) + len(two)
            rests.append(two + _ids(it))
            assert Counter(first + rests[-1]) == Counter(range(101)), len(rests)
        assert rests[0] == rests[1] == rests[2]  # the same order each time (same seed)
        assert sorted(_ids(it)) == list(range(101))  # then epoch 1, whole
    finally:
        loader.shutdown()


def test_two_ranks_rewinding_together_twice_join_one_restore_each_time(ray_session, tmp_path):
    source = ParquetSource(write_parquet(tmp_path, ROWS))
    loader = Loader(source, batch_size=8, shuffle=True, seed=5, name=unique_name("rewind"))
    ranks = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    try:
        first = [i for batches in run_lockstep(ranks, steps=2) for i in _ids(batches)]
        checkpoint = ranks[0].state_dict()
        run_lockstep(ranks, steps=2)
        for _ in range(2):
            generations = []
            for it in ranks:  # rank 0 restores; rank 1's load of the same state joins it
                it.load_state_dict(checkpoint)
                generations.append(it._generation)
            assert generations[0] == generations[1]  # one restore: rank 0 is not stale
            rest = [i for batches in run_lockstep(ranks) for i in _ids(batches)]
            assert Counter(first + rest) == Counter(range(101))
    finally:
        loader.shutdown()
