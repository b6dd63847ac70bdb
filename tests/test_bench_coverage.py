"""The benchmarks' exactly-once check works on runs of ids (so the harness's memory stays
small); it must count what the plain count over every id counts."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks._measure import EpochTimer, coverage


def _reference(ids: np.ndarray, num_rows: int) -> dict:
    unique = np.unique(ids)
    missing = num_rows - int(np.count_nonzero((unique >= 0) & (unique < num_rows)))
    extra = int(np.count_nonzero((unique < 0) | (unique >= num_rows)))
    duplicates = int(ids.size - unique.size)
    return {
        "ok": missing == 0 and duplicates == 0 and extra == 0,
        "rows_received": int(ids.size),
        "missing": missing,
        "duplicates": duplicates,
        "unknown_ids": extra,
    }


batch = st.lists(st.integers(-3, 40), max_size=12)
rank = st.lists(batch, max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(rank, min_size=1, max_size=3), st.integers(0, 40))
def test_coverage_of_runs_counts_as_the_ids_do(ranks, num_rows):
    records = [EpochTimer(r, 0).consume(batches, lambda b: b) for r, batches in enumerate(ranks)]
    ids = np.array([i for batches in ranks for b in batches for i in b], dtype=np.int64)
    assert coverage(records, num_rows) == _reference(ids, num_rows)
    assert [r.rows for r in records] == [sum(map(len, batches)) for batches in ranks]


def test_an_unshuffled_epoch_is_kept_as_one_run_per_rank():
    batches = [np.arange(s, s + 8) for s in range(0, 64, 8)]
    record = EpochTimer(0, 0).consume(batches, lambda b: b)
    assert record.runs.tolist() == [[0, 64]]
    assert coverage([record], 64)["ok"]
    assert not coverage([record, record], 64)["ok"]
