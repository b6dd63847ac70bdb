"""torch `DataLoader` and Accelerate over rayshard's `IterableAdapter`: batches pass
through unchanged (no second batching), every epoch exactly once; `num_workers > 0` is
refused (each worker process would read the rank's whole shard again)."""

from __future__ import annotations

import collections

import pytest
import torch

from rayshard.frameworks.torch import IterableAdapter, dataloader
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import unique_name, write_parquet

pytestmark = pytest.mark.ray

SIZES = [37, 23, 40]  # 100 rows
ROWS, BATCH = sum(SIZES), 8


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("torch"), SIZES, row_group_size=10)


@pytest.fixture
def loader(ray_session, dataset):
    made = Loader(ParquetSource(dataset), batch_size=BATCH, name=unique_name("tdl"), shuffle=True)
    yield made
    made.shutdown()


def _epochs(batches, epochs: int) -> list[collections.Counter]:
    out = []
    for _ in range(epochs):
        seen: collections.Counter = collections.Counter()
        for batch in batches:
            assert batch["x"].shape == (len(batch["id"]), 4), "batched twice"
            assert len(batch["id"]) <= BATCH
            seen.update(batch["id"][~batch["_padded"]].tolist())
        out.append(seen)
    return out


def test_dataloader_passes_batches_through_every_epoch_exactly_once(loader):
    it = loader.iterator(world_rank=0, world_size=1)
    batches = dataloader(it)
    assert len(batches) == len(it) == -(-ROWS // BATCH)
    for seen in _epochs(batches, 3):
        assert seen == collections.Counter(range(ROWS))
    assert it.epoch == 3


def test_transform_and_state_go_through_the_adapter(loader):
    it = loader.iterator(world_rank=0, world_size=1)
    adapter = IterableAdapter(it, transform=lambda b: {"id": b["id"] * 10, "_padded": b["_padded"]})
    first = next(iter(torch.utils.data.DataLoader(adapter, batch_size=None)))
    assert set(first) == {"id", "_padded"} and (first["id"] % 10 == 0).all()
    state = adapter.state_dict()
    assert state["epoch"] == 0 and state["consumed"]


def test_num_workers_and_batch_size_are_refused(loader):
    it = loader.iterator(world_rank=0, world_size=1)
    with pytest.raises(ValueError, match="num_workers=2"):
        dataloader(it, num_workers=2)
    with pytest.raises(ValueError, match="batch_size=4"):
        dataloader(it, batch_size=4)
    # A DataLoader built by hand with workers fails on the first batch, naming the fix.
    by_hand = torch.utils.data.DataLoader(IterableAdapter(it), batch_size=None, num_workers=1)
    with pytest.raises(RuntimeError, match="num_workers=0"):
        next(iter(by_hand))


def test_accelerate_prepare_in_one_process_covers_epochs_but_reads_a_batch_ahead(loader):
    # Why the README says not to prepare it: a state taken at a step counts one batch more.
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    it = loader.iterator(world_rank=0, world_size=1)
    prepared = accelerator.prepare(dataloader(it))
    with pytest.warns(RuntimeWarning, match="reads a batch ahead of the loop"):
        epochs = _epochs(prepared, 2)  # (warned once)
    for seen in epochs:
        assert seen == collections.Counter(range(ROWS))
    steps = iter(prepared)
    next(steps)  # the loop holds its first batch of the epoch
    assert it.stats()["batches_received"] == 2
