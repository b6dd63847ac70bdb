"""The pure batch-making steps every reader runs, without Ray: rebatching record batches
into batches of exactly `batch_size` rows, converting them to numpy, and the sample-id
runs a consumer acknowledges."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.data.batching import FLUSH, rebatch, to_numpy
from rayshard.plan.id_runs import sample_runs


def record_batches(sizes: list[int]) -> list[pa.RecordBatch]:
    """Record batches of the given sizes holding ids 0, 1, ... and a 3-wide feature."""
    out, start = [], 0
    for size in sizes:
        ids = np.arange(start, start + size, dtype=np.int64)
        x = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float32)), 3)
        out.append(pa.RecordBatch.from_arrays([pa.array(ids), x], names=["id", "x"]))
        start += size
    return out


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), max_size=12),
    batch_size=st.integers(1, 17),
    flush_at=st.integers(0, 12),
)
def test_rebatch_cuts_rows_in_order_into_full_batches(sizes, batch_size, flush_at):
    stream = record_batches(sizes)
    stream.insert(min(flush_at, len(stream)), FLUSH)
    out = list(rebatch(iter(stream), batch_size, to_numpy))
    assert out.count(FLUSH) == 1
    flush = out.index(FLUSH)
    batches = [b for b in out if b is not FLUSH]
    ids = np.concatenate([b["id"] for b in batches]) if batches else np.empty(0, np.int64)
    assert ids.tolist() == list(range(sum(sizes)))  # every row once, in order
    for batch in batches:
        assert batch["x"].shape == (len(batch["id"]), 3)
        assert (batch["x"][:, 0] == batch["id"]).all()  # rows stay whole across cuts
    # Only the batch before the FLUSH and the last one may be short.
    short = [i for i, b in enumerate(out) if b is not FLUSH and len(b["id"]) != batch_size]
    assert set(short) <= {flush - 1, len(out) - 1}


@given(st.lists(st.integers(0, 60), unique=True, max_size=40))
def test_sample_runs_cover_exactly_the_ids(ids):
    runs = sample_runs(np.array(sorted(ids), dtype=np.int64))
    covered = [i for start, end in runs for i in range(start, end)]
    assert covered == sorted(ids)
    assert all(a[1] < b[0] for a, b in zip(runs, runs[1:]))  # merged: gaps between runs


def test_padding_a_large_sample_builds_runs_bounded_in_bytes():
    """1,000 padding rows of a 2.2 MB sample: every row comes, marked and repeating it
    (a run of 1,024 copies was built at once: over 2 GiB of binary offsets it split into
    chunks, of which one was kept, and the batch's columns disagreed in length)."""
    from rayshard.data.batching import PADDING_RUN_BYTES, pad_rows
    from rayshard.sources import TableSource

    image = b"\x01" * 2_200_000
    source = TableSource(pa.table({"id": [0, 1], "img": pa.array([b"x", image], pa.binary())}))
    rows = list(pad_rows(source, 1000, 1, None, {}))
    assert sum(batch.num_rows for batch in rows) == 1000
    assert max(batch.nbytes for batch in rows) <= PADDING_RUN_BYTES
    assert all(batch.column("_padded").to_pylist() == [True] * batch.num_rows for batch in rows)
    assert {i for batch in rows for i in batch.column("_index").to_pylist()} == {1}
    assert rows[0].column("img")[0].as_py() == image
