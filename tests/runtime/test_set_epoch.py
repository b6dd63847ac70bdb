"""`set_epoch`, as a PyTorch user calls it on a `DistributedSampler`: at the top of every
epoch (every epoch exactly once, and after a mid-epoch resume the resume is kept); in the
middle of an epoch (that epoch again from its start); ahead (epochs skipped); and
backwards, which is refused with an error that says what to do instead."""

from __future__ import annotations

import pytest

from rayshard.errors import StaleClientError
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, run_lockstep, unique_name, write_parquet

pytestmark = pytest.mark.ray

SIZES = [30, 20, 10]  # 60 rows


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("set_epoch"), SIZES, row_group_size=10)


def _loader(dataset, name: str) -> Loader:
    source = ParquetSource(dataset, columns=["id"])
    return Loader(source, batch_size=8, shuffle=True, seed=3, name=name)


def _ids(per_rank) -> list[int]:
    return [i for batches in per_rank for i in real_ids(batches)]


def test_set_epoch_each_epoch_and_after_a_resume_keeps_exact_coverage(ray_session, dataset):
    name = unique_name("set-epoch")
    loader = _loader(dataset, name)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    try:
        for epoch in range(2):
            for it in its:
                it.set_epoch(epoch)
            assert sorted(_ids(run_lockstep(its))) == list(range(60)), epoch
        for it in its:
            it.set_epoch(2)
        head = _ids(run_lockstep(its, steps=2))
        state = its[0].state_dict()
    finally:
        for it in its:
            it.close()
        loader.shutdown()
    loader = _loader(dataset, name)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    try:
        for it in its:
            it.load_state_dict(state)
            it.set_epoch(2)  # the sampler habit after the resume: the resume holds
        assert sorted(head + _ids(run_lockstep(its))) == list(range(60))
    finally:
        loader.shutdown()


def test_set_epoch_backwards_is_refused_naming_the_way_back(ray_session, dataset):
    loader = _loader(dataset, unique_name("set-epoch-back"))
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    try:
        first = real_ids([next(iter(it))])
        state = it.state_dict()
        it.set_epoch(0)  # mid-epoch: the epoch again from its start
        assert sorted(real_ids(it)) == list(range(60))
        it.set_epoch(2)  # ahead: epoch 1 is skipped
        assert sorted(real_ids(it)) == list(range(60)) and it.epoch == 3
        it.set_epoch(1)
        with pytest.raises(StaleClientError, match=r"only go forward.*load_state_dict"):
            next(iter(it))
        it.load_state_dict(state)  # the way back the message names
        assert sorted(first + real_ids(it)) == list(range(60))
    finally:
        loader.shutdown()


@pytest.mark.parametrize(
    ("policy", "consumer_reads"), [("data", False), ("dynamic", True), ("dynamic", False)]
)
def test_set_epoch_in_the_middle_reads_it_again_on_every_read_path(
    ray_session, dataset, policy, consumer_reads
):
    """Both ranks read two batches each, then `set_epoch(0)` and read again. Through a
    reader actor the epoch comes again from its start (it hung: the reader took the
    repeat for a group member's start and served blocks already taken). Under `dynamic`
    what the ranks received and had acknowledged is not read again, and the rest of the
    shared epoch all comes (one rank lost it: its leases stayed held; two hung)."""
    source = ParquetSource(dataset, columns=["id"])
    loader = Loader(
        source,
        batch_size=2,  # many blocks: the old stream's block calls still wait at the restart
        batches_per_object=1,
        shuffle=True,
        seed=3,
        policy=policy,
        consumer_reads=consumer_reads,
        name=unique_name("set-epoch-mid"),
    )
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    try:
        head = _ids(run_lockstep(its, steps=4))
        for it in its:
            it.set_epoch(0)
        again = _ids(run_lockstep(its))
        if policy == "data":
            assert sorted(again) == list(range(60))  # the epoch from its start
        else:
            assert sorted(head + again) == list(range(60))  # the shared rest, once
        assert [it.epoch for it in its] == [1, 1]
    finally:
        loader.shutdown()


def test_a_new_iterator_after_a_restart_through_a_reader_actor_reads_its_epoch(
    ray_session, dataset
):
    """An iterator restarted its epoch (`set_epoch` in mid-epoch) through the rank's reader
    actor; a newer iterator of the rank, which has restarted nothing, takes the reading over
    and gets the epoch's batches (block calls name the reading `start` answered, not a
    count of restarts, which the newer iterator does not share)."""
    source = ParquetSource(dataset, columns=["id"])
    loader = Loader(
        source,
        batch_size=4,
        batches_per_object=1,
        consumer_reads=False,
        name=unique_name("set-epoch-takeover"),
    )
    first = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    try:
        run_lockstep([first], steps=2)
        first.set_epoch(0)
        run_lockstep([first], steps=2)
        newer = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        assert set(_ids([list(newer)])) >= set(range(8, 60))  # (the epoch, or its rest)
    finally:
        loader.shutdown()


def test_a_state_after_a_rewind_counts_what_was_received_before_it(ray_session, dataset):
    """Static: `set_epoch(0)` in the middle reads the epoch again from its start; a state
    saved after it still counts the rows received before the rewind, so a resume from it
    reads neither those nor the ones received since."""
    loader = _loader(dataset, unique_name("set-epoch-state"))
    try:
        its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in (0, 1)]
        head = _ids(run_lockstep(its, steps=2))
        for it in its:
            it.set_epoch(0)
        since = _ids(run_lockstep(its, steps=1))
        state = its[0].state_dict()
    finally:
        loader.shutdown()
    resumed = _loader(dataset, unique_name("set-epoch-state"))
    try:
        state["loader"] = resumed.loader_id
        its = [resumed.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in (0, 1)]
        for it in its:
            it.load_state_dict(state)
        rest = _ids(run_lockstep(its))
    finally:
        resumed.shutdown()
    assert len(rest) == len(set(rest)) and not set(rest) & (set(head) | set(since))
    assert sorted(set(rest) | set(head) | set(since)) == list(range(60))
