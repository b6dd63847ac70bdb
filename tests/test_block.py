"""The tag every batch carries (`rayshard.runtime.block.tag_batch`) says exactly which
samples its consumer acknowledges, for any ids, padding, transform drops and packing; a
`Block` holds the merged runs of its batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from rayshard.plan import intervals as iv
from rayshard.runtime.block import Block, tag_batch
from rayshard.runtime.packing_stage import COMPLETED_KEY, PARTIAL_KEY
from rayshard.runtime.transform_stage import DROPPED_KEY

ids_st = st.lists(st.integers(0, 200), min_size=1, max_size=40, unique=True)


@given(ids=ids_st, data=st.data())
def test_runs_cover_the_real_and_dropped_samples_once(ids, data):
    padded = np.array(data.draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids))))
    dropped = data.draw(st.lists(st.integers(201, 300), max_size=5, unique=True))
    batch = {
        "x": np.zeros((len(ids), 3), np.float32),
        "_index": np.array(ids, np.int64),
        "_padded": padded,
        DROPPED_KEY: np.array(dropped, np.int64),
    }
    meta, out = tag_batch(batch)
    real = [i for i, p in zip(ids, padded) if not p]
    assert meta.real == len(real)
    assert list(iv.indices(meta.runs)) == sorted(real + dropped)
    assert iv.normalize(meta.runs) == tuple(map(tuple, meta.runs.tolist()))  # merged, in order
    assert meta.runs.dtype == np.int64 and meta.runs.shape == (meta.runs.shape[0], 2)
    assert DROPPED_KEY not in out and {"x", "_index", "_padded"} <= set(out)
    assert meta.nbytes == sum(v.nbytes for v in out.values()) and meta.partial == []


def test_a_packed_batch_acknowledges_finished_documents_and_split_progress():
    batch = {
        "tokens": np.zeros((2, 8), np.int32),
        "_index": np.array([0, 1]),
        "_padded": np.array([False, False]),
        COMPLETED_KEY: np.array([7, 3, 4], np.int64),
        PARTIAL_KEY: np.array([[9, 5]], np.int64),
    }
    meta, out = tag_batch(batch)
    assert meta.runs.tolist() == [[3, 5], [7, 8]] and meta.real == 3
    assert meta.partial == [[9, 5]]
    assert COMPLETED_KEY not in out and PARTIAL_KEY not in out


@given(st.lists(ids_st, min_size=1, max_size=5))
def test_a_block_merges_its_batches_runs(batches):
    tagged = [
        tag_batch({"_index": np.array(ids), "_padded": np.zeros(len(ids), bool)}) for ids in batches
    ]
    block = Block.of((3, 1), 5, tagged)
    assert (block.generation, block.epoch, block.index) == (3, 1, 5)
    assert block.runs == iv.normalize([i, i + 1] for ids in batches for i in ids)


def test_bytes_of_string_and_bytes_columns_are_counted():
    # The reader closes blocks on the same count (`object_bytes`): a batch of image bytes
    # or text counts its payload, not zero.
    batch = {
        "image": [b"\x00" * 100, b"\x01" * 50],
        "text": ["abc", "de"],
        "_index": np.array([0, 1], np.int64),
        "_padded": np.array([False, False]),
    }
    meta, _ = tag_batch(batch)
    assert meta.nbytes == 150 + 5 + 2 * 8 + 2


def test_a_text_column_counts_its_values_bytes_shipped_or_not():
    # a reader ships string and binary columns as Arrow (`rayshard.data.wire`); the tag's
    # bytes (and so block sizing and the bytes metric) count the values (UTF-8), as for
    # the object array a consumer that reads for itself tags
    text = ["a" * 100, "bé", ""]
    ids = {"_index": np.arange(3), "_padded": np.zeros(3, bool)}
    shipped, _ = tag_batch({"s": pa.array(text), **ids})
    local, _ = tag_batch({"s": np.array(text, dtype=object), **ids})
    assert shipped.nbytes == local.nbytes == 103 + 3 * 8 + 3
