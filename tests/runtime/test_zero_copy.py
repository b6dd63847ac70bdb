"""With `batch_format="torch"` and no device to copy to, the loader hands the training
loop tensors that view the memory the batches came in, not per-batch copies.

Through the reader actor (`consumer_reads=False`) that memory is the object store's (the
reader's `ray.put` blocks): proven by address, every numeric tensor's data pointer lies
inside this process's mapping of Ray's plasma store. A consumer that reads for itself
(the default for a rank with one consumer) hands out numpy arrays viewing the Arrow
arrays Parquet was decoded into (proven by their `base` chain), and the feed's tensors
view those arrays (`tests/device/test_feed.py`)."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest
import torch

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import unique_name, write_parquet

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps"),
]


def plasma_mappings() -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of the plasma store (/dev/shm/plasma...,
    or the fallback directory's plasma file)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and "plasma" in fields[5]:
                start, end = (int(part, 16) for part in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def inside(pointer: int, ranges: list[tuple[int, int]]) -> bool:
    return any(start <= pointer < end for start, end in ranges)


def test_cpu_torch_batches_view_object_store_memory(ray_session, tmp_path):
    loader = Loader(
        ParquetSource(write_parquet(tmp_path, [40, 24])),
        name=unique_name(),
        batch_size=8,
        consumer_reads=False,
    )
    try:
        iterator = loader.iterator(world_rank=0, world_size=1, batch_format="torch", device="cpu")
        batches = list(iterator)
        assert batches
        ranges = plasma_mappings()
        assert ranges, "no plasma mapping in /proc/self/maps"
        checked = 0
        for batch in batches:
            for key, value in batch.items():
                if isinstance(value, torch.Tensor) and value.numel():
                    assert inside(value.data_ptr(), ranges), (key, hex(value.data_ptr()))
                    checked += 1
        assert checked >= 2 * len(batches)  # at least the id and index columns of each
    finally:
        loader.shutdown()


def arrow_owner(array: np.ndarray) -> object | None:
    """The Arrow array or buffer at the end of `array`'s chain of bases, or None (numpy
    owns it)."""
    owner = array
    while isinstance(owner, np.ndarray):
        owner = owner.base
    return owner if isinstance(owner, (pa.Array, pa.Buffer)) else None


def test_consumer_reads_hand_out_views_of_the_decoded_arrow_arrays(ray_session, tmp_path):
    loader = Loader(
        ParquetSource(write_parquet(tmp_path, [40, 24])), name=unique_name(), batch_size=8
    )
    try:
        iterator = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        assert iterator._local is not None  # the default for a rank's only consumer
        batches = list(iterator)
        assert sum(len(b["id"]) for b in batches) == 64
        for batch in batches:
            for key in ("id", "x", "_index"):  # `_padded` is a bitmap in Arrow: unpacked
                assert arrow_owner(batch[key]) is not None, (key, batch[key].base)
    finally:
        loader.shutdown()
