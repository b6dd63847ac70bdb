"""Arrow <-> numpy without pandas (`rayshard.data.arrow_numpy`): the same arrays pyarrow's
own conversions make, and a reading process that never imports pandas."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.data.arrow_numpy import arrow_of, numpy_of

ROOT = Path(__file__).resolve().parent.parent
TYPES = [
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
    pa.uint64(), pa.float16(), pa.float32(), pa.float64(), pa.bool_(), pa.string(),
    pa.date32(),
]  # fmt: skip


def values_of(kind: pa.DataType, n: int, nulls: list[bool]) -> pa.Array:
    rng = np.random.default_rng(n)
    if pa.types.is_boolean(kind):
        raw = list(rng.integers(0, 2, n).astype(bool))
    elif pa.types.is_floating(kind):
        raw = list(rng.standard_normal(n))
    elif pa.types.is_string(kind):
        raw = [f"s{i}" for i in range(n)]
    else:
        raw = [int(v) for v in rng.integers(0, 100, n)]
    values = [None if null else v for v, null in zip(raw, nulls)]
    if pa.types.is_float16(kind):
        return pa.array(np.array(raw, np.float16), mask=np.array(nulls, bool))
    return pa.array(values, pa.int32() if pa.types.is_date32(kind) else kind).cast(kind)


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(TYPES),
    n=st.integers(0, 70),
    offset=st.integers(0, 20),
    length=st.integers(0, 70),
    null_every=st.sampled_from([0, 3, 1]),
)
def test_numpy_of_is_to_numpy(kind, n, offset, length, null_every):
    nulls = [bool(null_every) and i % null_every == 0 for i in range(n)]
    array = values_of(kind, n, nulls).slice(min(offset, n), length)  # slices keep offsets
    got, expected = numpy_of(array), array.to_numpy(zero_copy_only=False)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.flags.writeable == expected.flags.writeable  # views of Arrow stay read-only
    if expected.dtype == object:
        assert list(got) == list(expected)
    else:
        np.testing.assert_array_equal(got, expected)  # NaN and NaT count as equal


@settings(max_examples=100, deadline=None)
@given(
    dtype=st.sampled_from(["int8", "int32", "int64", "uint16", "float32", "float64", "bool"]),
    n=st.integers(0, 50),
    step=st.sampled_from([1, 2, 3]),
    cast=st.sampled_from([None, pa.int64(), pa.float64()]),
)
def test_arrow_of_is_pa_array(dtype, n, step, cast):
    values = (np.arange(n) % 7).astype(dtype)[::step]  # strided: not contiguous
    if cast is not None and dtype == "bool":
        cast = None  # pa.array does not cast bools to numbers either
    got, expected = arrow_of(values, cast), pa.array(values, cast)
    assert got.type == expected.type and got.equals(expected)


def test_a_reading_process_never_imports_pandas(tmp_path):
    """A fresh process reads Parquet through a rank's pipeline (rows, batches, tags, the
    user's numpy batches; then padded token lists, and a dynamic rank's row filter), and
    asks for the torch feed's default device on a running Ray outside Ray Train: pandas
    and `ray.train` stay out of it."""
    table = pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(400.0)), 4),
            "tokens": pa.array([list(range(i % 5)) for i in range(100)], pa.list_(pa.int64())),
            "label": pa.array(np.arange(100)),
        }
    )
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=30)
    script = textwrap.dedent(f"""
        import sys
        import ray
        from rayshard.data.batching import iter_rows, pad_rows
        from rayshard.data.formats import convert_batch
        from rayshard.data.wire import for_user
        from rayshard.runtime.block import tag_batch
        from rayshard.runtime.dynamic_rows import keep_rows
        from rayshard.runtime.pipeline import reader_batches
        from rayshard.sources.parquet import ParquetSource
        source = ParquetSource([{str(tmp_path / "d.parquet")!r}])
        rows = list(iter_rows(source, source.splits(), None))
        kept = keep_rows(rows[0], [(0, 10)])
        assert kept.num_rows == 10
        padding = list(pad_rows(source, 9, 3, None, {{}}))  # one record batch of 9 rows
        assert [p.num_rows for p in padding] == [9] and padding[0]["_index"].to_pylist() == [3] * 9
        seen = 0
        stream = reader_batches(iter(rows), batch_size=8, transform=None, workers=None,
                                loader="t", seed=0, epoch=0, rank=0, keep_text=True)
        for batch in stream:
            meta, batch = tag_batch(batch)
            batch = convert_batch(for_user(batch), "numpy", (), None)
            seen += len(batch["label"])
        assert seen == 100 and batch["x"].shape[1] == 4 and "tokens" in batch
        ray.init(address="local", num_cpus=1, include_dashboard=False)
        from rayshard.device.feed import default_device
        assert str(default_device()) == "cpu"
        ray.shutdown()
        print("pandas" in sys.modules, "ray.train" in sys.modules)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["False", "False"]


class _OneColumnSource:
    """A source whose sample i is the row ("s<i>" as a string_view, i)."""

    def read(self, start, end, columns):
        texts = pa.array([f"s{i}" for i in range(start, end)], pa.string_view())
        yield pa.record_batch({"text": texts, "n": pa.array(list(range(start, end)))})


@pytest.mark.parametrize("count", [0, 1, 2, 1024, 1025, 3000])
def test_padding_runs_go_in_batches_of_at_most_padding_run_rows(count):
    """`count` padding rows of one sample: every row that sample's, tagged padded, in
    batches of at most `PADDING_RUN` rows (a run of `repeat` padding can be most of an
    epoch), and for a column type pyarrow's `take` has no kernel for (string_view)."""
    from rayshard.data.batching import PADDING_RUN, pad_rows

    batches = list(pad_rows(_OneColumnSource(), count, 7, None, {}))
    assert sum(b.num_rows for b in batches) == count
    assert all(0 < b.num_rows <= PADDING_RUN for b in batches)
    for batch in batches:
        assert batch["text"].type == pa.string_view()
        assert batch["text"].to_pylist() == ["s7"] * batch.num_rows
        assert batch["_index"].to_pylist() == [7] * batch.num_rows
        assert batch["_padded"].to_pylist() == [True] * batch.num_rows
