"""The pure parts of transforms, without Ray: per-sample random state, the checks on what a
transform returns, filter accounting, per_sample, input conversion, the error type."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayshard.data.transforms import (
    TransformContext,
    check_transform,
    keep_rows,
    per_sample,
    sample_rng,
)
from rayshard.errors import DataError, TransformError
from rayshard.runtime.transform_stage import (
    DROPPED_KEY,
    apply_transform,
    transform_input,
    transform_stream,
)


def ctx_for(indices, padded=None, seed=3, epoch=1, rank=0) -> TransformContext:
    indices = np.asarray(indices, dtype=np.int64)
    padded = np.zeros(len(indices), bool) if padded is None else np.asarray(padded, bool)
    return TransformContext("L:abc", seed, epoch, rank, indices, padded)


def batch_for(ctx: TransformContext) -> dict:
    return {"x": ctx.indices * 10, "_index": ctx.indices, "_padded": ctx.padded}


@given(
    seed=st.integers(0, 2**63 - 1),
    epoch=st.integers(0, 10**6),
    indices=st.lists(st.integers(0, 2**40), min_size=1, max_size=20, unique=True),
    rank=st.integers(0, 64),
)
@example(seed=0, epoch=0, indices=[0], rank=0)
def test_rng_of_a_row_depends_only_on_seed_epoch_and_sample(seed, epoch, indices, rank):
    ctx = ctx_for(indices, seed=seed, epoch=epoch, rank=rank)
    reordered = ctx_for(indices[::-1], seed=seed, epoch=epoch, rank=rank + 1)
    for row, index in enumerate(indices):
        expected = sample_rng(seed, epoch, index).random(3)
        assert np.array_equal(ctx.rng(row).random(3), expected)
        assert np.array_equal(reordered.rng(len(indices) - 1 - row).random(3), expected)


def test_rng_streams_differ_by_sample_epoch_and_seed():
    draws = {
        (s, e, i): sample_rng(s, e, i).integers(0, 2**62)
        for s in (0, 1)
        for e in (0, 1)
        for i in (0, 1, 2**33)
    }
    assert len(set(draws.values())) == len(draws)
    with pytest.raises(ValueError, match="must all be >= 0"):
        sample_rng(0, 0, -1)


def test_same_rows_returned_keep_index_and_padding():
    ctx = ctx_for([5, 6, 7], padded=[False, False, True])
    out = apply_transform(lambda b, c: {"y": b["x"] + 1}, batch_for(ctx), ctx)
    assert out["y"].tolist() == [51, 61, 71]
    assert out["_index"].tolist() == [5, 6, 7] and out["_padded"].tolist() == [0, 0, 1]
    assert DROPPED_KEY not in out


def test_filter_records_dropped_real_samples_only():
    ctx = ctx_for([3, 4, 5, 6, 5], padded=[False, False, False, False, True])
    out = apply_transform(lambda b, c: keep_rows(b, b["_index"] % 3 != 0), batch_for(ctx), ctx)
    assert out["_index"].tolist() == [4, 5, 5]
    assert out["_padded"].tolist() == [False, False, True]
    assert out[DROPPED_KEY].tolist() == [3, 6]  # padding rows are never acknowledged


def test_keep_rows_refuses_row_positions_and_a_mask_of_another_length():
    batch = batch_for(ctx_for([1, 2, 3]))
    with pytest.raises(ValueError, match=r"one bool per row of the batch \(3 rows\), got int"):
        keep_rows(batch, [0, 2])  # positions: numpy would keep rows 1 and 2 (truthy)
    with pytest.raises(ValueError, match=r"\(3 rows\), got bool of shape \(2,\)"):
        keep_rows(batch, [True, False])
    assert keep_rows(batch, [True, False, True])["_index"].tolist() == [1, 3]
    assert keep_rows(batch_for(ctx_for([])), [])["_index"].tolist() == []


def test_filter_of_everything_leaves_an_empty_batch():
    ctx = ctx_for([1, 2])
    out = apply_transform(lambda b, c: keep_rows(b, [False, False]), batch_for(ctx), ctx)
    assert out["x"].shape == (0,) and out[DROPPED_KEY].tolist() == [1, 2]


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda b, c: None, "returned None"),
        (lambda b, c: {"x": np.arange(4), **{k: b[k] for k in ("_index", "_padded")}}, "lengths"),
        (lambda b, c: {"x": np.arange(2)}, "without '_index'"),
        (lambda b, c: {"x": np.arange(5)}, "may drop rows, not add them"),
        (lambda b, c: {"x": 3}, "numpy array with a row dimension"),
        (lambda b, c: {**b, "_index": np.array([1, 1, 2])}, "not rows of its batch"),
        (lambda b, c: {**b, DROPPED_KEY: b["x"]}, "that name is rayshard's"),
        (lambda b, c: {"x": b["x"][:1], "_index": b["_index"][:1]}, "keep both"),
    ],
)
def test_unusable_results_are_transform_errors(fn, message):
    ctx = ctx_for([1, 2, 3])
    with pytest.raises(TransformError, match=message):
        apply_transform(fn, batch_for(ctx), ctx)


def test_error_names_loader_rank_epoch_samples_and_keeps_the_traceback():
    def broken(batch, ctx):
        raise KeyError("no such column")

    ctx = ctx_for([9, 4, 7], epoch=2, rank=1)
    with pytest.raises(TransformError) as info:
        apply_transform(broken, batch_for(ctx), ctx)
    error = info.value
    assert isinstance(error, DataError)
    text = str(error)
    assert "'L:abc'" in text and "rank 1" in text and "epoch 2" in text and "[4, 9]" in text
    assert "in broken" in text and "KeyError: 'no such column'" in text
    copy = pickle.loads(pickle.dumps(error))  # crosses the actor boundary
    assert type(copy) is TransformError and str(copy) == text
    assert (copy.loader, copy.rank, copy.epoch, copy.samples) == ("L:abc", 1, 2, (4, 10))


def test_per_sample_stacks_drops_and_keeps_columns_of_empty_batches():
    def fn(sample, rng):
        if sample["x"] % 20 == 0:
            return None
        return {"y": np.full(2, sample["x"]), "name": f"s{sample['x']}", "r": rng.random()}

    transform = per_sample(fn)
    ctx = ctx_for([1, 2, 3])
    out = apply_transform(transform, batch_for(ctx), ctx)
    assert out["y"].shape == (2, 2) and out["name"] == ["s10", "s30"]
    assert out["r"].tolist() == [sample_rng(3, 1, 1).random(), sample_rng(3, 1, 3).random()]
    assert out[DROPPED_KEY].tolist() == [2]
    empty = ctx_for([2, 4])
    out = apply_transform(transform, batch_for(empty), empty)
    assert out["y"].shape == (0, 2) and out["name"] == [] and out["_index"].size == 0


def test_per_sample_arrays_of_different_shapes_are_a_clear_error_and_lists_pass():
    """Token ids per document differ in length: a message naming the key and the way out
    (not numpy's 'all input arrays must have the same shape'); as lists they pass."""
    ctx = ctx_for([1, 2, 3])
    ragged = per_sample(lambda s, r: {"ids": np.arange(s["x"] % 7 + 1, dtype=np.int32)})
    with pytest.raises(TransformError, match=r"key .ids. holds arrays of different shapes .*lists"):
        apply_transform(ragged, batch_for(ctx), ctx)
    as_lists = per_sample(lambda s, r: {"ids": list(range(s["x"] % 7 + 1))})
    out = apply_transform(as_lists, batch_for(ctx), ctx)
    assert [len(ids) for ids in out["ids"]] == [4, 7, 3]


def test_transform_input_gives_strings_and_bytes_as_lists():
    table = pa.table(
        {
            "s": pa.array(["a", None, "ccc"]),
            "b": pa.array([b"\x00", b"xy", b""], pa.large_binary()),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6.0)), 2),
            "_index": pa.array([0, 1, 2], pa.int64()),
        }
    )
    batch = transform_input(table)
    assert list(batch) == ["s", "b", "v", "_index"]
    encoded = table.set_column(0, "s", table.column("s").dictionary_encode())
    assert transform_input(encoded)["s"] == ["a", None, "ccc"]  # as pandas writes strings
    assert batch["s"] == ["a", None, "ccc"] and batch["b"] == [b"\x00", b"xy", b""]
    assert batch["v"].shape == (3, 2) and isinstance(batch["_index"], np.ndarray)


def test_transform_input_applies_the_column_rules_as_without_a_transform():
    from rayshard.data.batching import to_numpy
    from rayshard.data.columns import ColumnRules, Padding

    table = pa.table(
        {
            "tok": pa.array([[7, 0, 3], [1], [2, 0]], pa.list_(pa.int32())),
            "x": pa.array([1.0, None, 3.0]),
            "s": pa.array(["a", None, "c"]),
            "_index": pa.array([0, 1, 2], pa.int64()),
        }
    )
    padding = {"tok": Padding(max_length=2, pad_value=-1)}
    rules = ColumnRules.build(padding, {"x": 0.0, "s": "?"}, table.schema)
    batch = transform_input(table, rules)
    plain = to_numpy(table.drop_columns(["s"]), rules)
    assert set(batch) == set(plain) | {"s"}  # tok_lengths and tok_mask included
    for key, value in plain.items():
        np.testing.assert_array_equal(batch[key], value)
    assert batch["tok"].tolist() == [[7, 0], [1, -1], [2, 0]]
    assert batch["tok_mask"].tolist() == [[True, True], [True, False], [True, True]]
    assert batch["x"].tolist() == [1.0, 0.0, 3.0] and batch["s"] == ["a", "?", "c"]
    # A column that merely ends in `_offsets` is a column like any other.
    own = pa.table({"pos_offsets": pa.array([1, 2, 3]), "_index": pa.array([0, 1, 2])})
    assert transform_input(own, rules)["pos_offsets"].tolist() == [1, 2, 3]


def test_stream_passes_flush_markers_and_builds_contexts():
    from rayshard.data.batching import FLUSH

    seen = []

    def spy(batch, ctx):
        seen.append((ctx.loader, ctx.seed, ctx.epoch, ctx.rank, ctx.indices.tolist()))
        return batch

    stream = [batch_for(ctx_for([0, 1])), FLUSH, batch_for(ctx_for([2]))]
    out = list(transform_stream(iter(stream), spy, loader="L", seed=4, epoch=5, rank=6))
    assert out[1] is FLUSH and len(out) == 3
    assert seen == [("L", 4, 5, 6, [0, 1]), ("L", 4, 5, 6, [2])]


def test_check_transform_refuses_what_cannot_run_in_a_reader():
    check_transform(None)
    check_transform(per_sample(lambda s, r: s))
    with pytest.raises(TypeError, match="is not callable"):
        check_transform(42)
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot be pickled"):
        check_transform(lambda batch, ctx: (lock, batch)[1])


@settings(max_examples=100, deadline=None)  # no per-example deadline on a shared machine
@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=12, unique=True),
    st.data(),
)
def test_kept_rows_in_any_order_acknowledge_exactly_the_real_samples_left_out(ids, data):
    """The checks of a transform's `_index` (fast path when every row comes back as it
    came, `isin` and a sort otherwise) keep their set meaning: any subset of the rows, in
    any order, is accepted and the real samples left out are dropped; a value that is not
    a row of the batch, or a repeat, is refused."""
    padded = data.draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids)))
    ctx = ctx_for(ids, padded=padded)
    keep = data.draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids)))
    order = data.draw(st.permutations([i for i, k in enumerate(keep) if k]))
    rows = np.array(order, dtype=np.int64)

    def subset(b, c):
        return {key: np.asarray(value)[rows] for key, value in b.items()}

    out = apply_transform(subset, batch_for(ctx), ctx)
    real = {i for i, p in zip(ids, padded) if not p}
    kept = {ids[r] for r in order if not padded[r]}
    assert out["_index"].tolist() == [ids[r] for r in order]
    assert out.get(DROPPED_KEY, np.zeros(0)).tolist() == sorted(real - kept)
    bad = data.draw(st.sampled_from(["unknown", "repeat"]))
    if bad == "repeat" and (not real or len(ids) < 2):
        return
    wrong = [99] if bad == "unknown" else [min(real)] * 2
    with pytest.raises(TransformError, match="not rows of its batch"):
        apply_transform(
            lambda b, c: {
                "x": np.zeros(len(wrong)),
                "_index": np.array(wrong),
                "_padded": np.zeros(len(wrong), bool),
            },
            batch_for(ctx),
            ctx,
        )


def _explode_at_3(batch, ctx):
    if 3 in ctx.indices:
        raise ValueError("sample 3 is cursed")
    return {"x": batch["x"]}


def test_a_worker_call_returns_the_batches_before_a_failure_with_the_error():
    from rayshard.runtime.reader_workers import ReaderWorker

    worker = ReaderWorker(None, _explode_at_3, "L:abc", 3, 1)
    batches = [batch_for(ctx_for([2 * i, 2 * i + 1])) for i in range(4)]  # 3 in the second
    results, error, seconds = worker.apply_batches(batches, 5)
    assert [r["x"].tolist() for r in results] == [[0, 10]] and isinstance(seconds, float)
    assert isinstance(error, TransformError)
    assert (error.rank, error.epoch, error.samples) == (1, 5, (2, 4))
    assert "sample 3 is cursed" in str(error)
    results, error, _ = worker.apply_batches(batches[2:], 5)
    assert len(results) == 2 and error is None


def test_worker_calls_group_cheap_batches_and_keep_slow_ones_alone():
    from rayshard.data.batching import FLUSH
    from rayshard.runtime.transform_workers import (
        CALL_SECONDS,
        GROUP_BATCHES,
        GROUP_BYTES,
        GroupSize,
        batch_groups,
    )

    # the README's numbers: about 20 ms of transform a call, at most 16 batches and 4 MiB
    assert (CALL_SECONDS, GROUP_BATCHES, GROUP_BYTES) == (0.02, 16, 4 << 20)
    size = GroupSize()
    assert size.batches == 1  # before the workers report: one batch a call
    size.observe(0.001, 4)  # 0.25 ms a batch: 80 fit in 20 ms, capped
    assert size.batches == GROUP_BATCHES
    size.observe(0.006, 2)  # 3 ms a batch
    assert size.batches == 6
    size.observe(0.03, 1)  # slower than a call's worth: alone
    assert size.batches == 1

    def batch(rows, width=1):
        return {"x": np.zeros((rows, width), np.float32), "_index": np.arange(rows)}

    size.batches = 3
    stream = [batch(1) for _ in range(4)] + [FLUSH] + [batch(1) for _ in range(2)]
    groups = list(batch_groups(iter(stream), size))
    assert [g if g is FLUSH else len(g) for g in groups] == [3, 1, FLUSH, 2]
    size.batches = GROUP_BATCHES
    third = GROUP_BYTES // 3
    stream = [{"x": np.zeros(n, np.uint8)} for n in (third, third, third, 2 * third)]
    stream.append({"x": np.zeros(2 * GROUP_BYTES, np.uint8)})  # over the cap: alone
    assert [len(g) for g in batch_groups(iter(stream), size)] == [3, 1, 1]  # by bytes
