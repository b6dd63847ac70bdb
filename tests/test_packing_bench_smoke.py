"""The packing benchmark's pieces that need no Ray (a real run starts Ray: minutes here,
so it is not part of the suite): argument checks, the data it writes, naive padding."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks.packing_bench import naive_padding, parse_args, raw_epoch, write_data


def test_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--seq-len", "4"])
    assert exit_.value.code == 2
    assert "Invalid value for '--seq-len': 4 is not in the range x>=8." in capsys.readouterr().err


def test_data_raw_read_and_naive_padding(tmp_path):
    lengths = write_data(tmp_path, 100, 64)
    assert lengths.min() >= 1 and lengths.max() <= 64
    table = pq.read_table(tmp_path)
    assert np.diff(table.column("tokens").combine_chunks().offsets.to_numpy()).tolist() == list(
        lengths
    )
    seconds, tokens = raw_epoch(tmp_path)
    assert tokens == lengths.sum() and seconds > 0
    naive = naive_padding(np.array([64, 32]), 64)
    assert naive == {"naive_row": 0.25, "naive_batch": 0.25}
