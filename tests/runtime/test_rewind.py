"""A loop that goes back to the same checkpoint again through the same iterators (a rewind
after a loss spike, `fit(ckpt_path=...)` run again in the same processes) reads the rest
of that checkpoint's epoch each time; the ranks of one restore join it (the peers' loads
of the same state start no new generation). Real Ray, real Parquet."""

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
    """The real samples of numpy batches (not the padding rows of `dynamic`'s equal steps)."""
    return [int(i) for b in batches for i in b["_index"][~b["_padded"]]]


def _loader(tmp_path, policy: str = "data", **options) -> Loader:
    source = ParquetSource(write_parquet(tmp_path, ROWS))
    return Loader(
        source,
        batch_size=8,
        shuffle=True,
        seed=5,
        policy=policy,
        name=unique_name("rewind"),
        **options,
    )


@pytest.mark.parametrize(
    "policy, interval", [("data", 0.1), ("dynamic", 0.1), ("data", 60), ("dynamic", 60)]
)
def test_a_rewind_to_the_same_checkpoint_twice_reads_its_rest_each_time(
    ray_session, tmp_path, policy, interval
):
    """(An `ack_interval_s` of 60: the batches since the last load are acknowledged by
    the load itself, so the rank is seen to have read since and restores again.)"""
    loader = _loader(tmp_path, policy, ack_interval_s=interval)
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


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_two_ranks_rewinding_together_twice_join_one_restore_each_time(
    ray_session, tmp_path, policy
):
    loader = _loader(tmp_path, policy)
    ranks = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    try:
        first = [i for batches in run_lockstep(ranks, steps=2) for i in _ids(batches)]
        checkpoint = ranks[0].state_dict()
        run_lockstep(ranks, steps=2)
        for _ in range(2):
            before, generations = ranks[0]._generation, []
            for it in ranks:  # rank 0 restores; rank 1's load of the same state joins it
                it.load_state_dict(checkpoint)
                generations.append(it._generation)
            assert generations == [before + 1] * 2  # one restore each time, rank 0 not stale
            one = [i for batches in run_lockstep(ranks, steps=1) for i in _ids(batches)]
            saved = ranks[1].state_dict()  # the checkpoint's samples and one step's
            assert sum(b - a for a, b in saved["consumed"]) == len(first) + len(one)
            rest = [i for batches in run_lockstep(ranks) for i in _ids(batches)]
            assert Counter(first + one + rest) == Counter(range(101))
    finally:
        loader.shutdown()


def test_a_peer_loading_the_current_state_late_joins_it_after_the_others_progress(
    ray_session, tmp_path
):
    """As a Hugging Face Trainer's resume: each process loads the epoch's start, then the
    checkpoint's state (here the same) at its first `set_epoch`, with no barrier between
    the processes: rank 0 trains on before rank 1's second load, which joins the restore
    (a restore would leave rank 0's iterator stale)."""
    loader = _loader(tmp_path)
    ranks = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    try:
        checkpoint = ranks[0].state_dict()  # the epoch's start
        for it in ranks:
            it.load_state_dict(checkpoint)
        ranks[0].load_state_dict(checkpoint)  # its second load: nothing received since
        ahead = _ids(itertools.islice(ranks[0], 2))
        ranks[0]._acks.flush(wait=True)  # its progress recorded
        ranks[1].load_state_dict(checkpoint)  # rank 1's second load, late
        assert ranks[1]._generation == ranks[0]._generation
        rest = [i for batches in run_lockstep(ranks) for i in _ids(batches)]
        assert Counter(ahead + rest) == Counter(range(101))
    finally:
        loader.shutdown()
