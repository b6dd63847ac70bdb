"""The straggler filter of a dynamic reader's row stream, without Ray: after a pause of
half the straggler timeout it asks which rows are still leased to it and drops the rest."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rayshard.runtime.dynamic_rows import drop_taken_back, keep_rows


def _batch(start: int, rows: int) -> pa.RecordBatch:
    ids = np.arange(start, start + rows)
    return pa.RecordBatch.from_arrays(
        [pa.array(ids), pa.array(ids), pa.array(np.zeros(rows, dtype=bool))],
        names=["id", "_index", "_padded"],
    )


def test_keep_rows_keeps_only_held_samples():
    kept = keep_rows(_batch(0, 10), ((2, 4), (8, 20)))
    assert kept.column("_index").to_pylist() == [2, 3, 8, 9]
    whole = _batch(0, 4)
    assert keep_rows(whole, ((0, 10),)) is whole


def test_rows_after_a_pause_are_filtered_by_what_is_still_held():
    ticks = iter([0.0, 0.1, 0.2, 5.0, 5.1])  # the pause comes before the third batch
    asked = []

    def held():
        asked.append(1)
        return [[20, 25]]

    batches = [_batch(0, 10), _batch(10, 10), _batch(20, 10), _batch(30, 10)]
    out = list(drop_taken_back(iter(batches), held, 1.0, clock=lambda: next(ticks)))
    ids = [i for b in out for i in b.column("_index").to_pylist()]
    assert ids == [*range(20), 20, 21, 22, 23, 24]  # batch 30..39 was taken back: dropped
    assert len(asked) == 1


def test_no_pause_no_question():
    ticks = iter(float(t) for t in range(10))
    out = list(drop_taken_back(iter([_batch(0, 5)]), lambda: [], 100.0, clock=lambda: next(ticks)))
    assert out[0].num_rows == 5
