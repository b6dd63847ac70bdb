"""File sources over many files and wide schemas: what their construction and reads do per
file, per row group and per column stays small (real Parquet files, no Ray)."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parquet_fixtures import ids_of

from rayshard.errors import ConfigError
from rayshard.sources import _catalog
from rayshard.sources.parquet import ParquetSource


def _write(folder, index: int, rows: int, value_type: pa.DataType, wide: int = 0) -> None:
    ids = np.arange(index * rows, (index + 1) * rows, dtype=np.int64)
    columns = {"id": ids, "v": pa.array(ids).cast(value_type)}
    columns.update({f"c{j}": ids.astype(np.float32) for j in range(wide)})
    pq.write_table(pa.table(columns), folder / f"part-{index:03d}.parquet")


def test_files_repeating_a_schema_are_not_merged_again(tmp_path, monkeypatch):
    """Each file's schema is compared with the dataset's field by field only when it
    differs from the previous file's (26 ms a file at 2,000 columns otherwise): 40 files
    with one int32 file among int64 ones merge 3 times, still promote, still refuse."""
    merges = []

    def counting(first, other):
        merges.append(other[0])
        return merge(first, other)

    merge = _catalog.merge_schemas
    monkeypatch.setattr(_catalog, "merge_schemas", counting)
    for index in range(40):
        _write(tmp_path, index, 3, pa.int32() if index == 30 else pa.int64(), wide=50)
    source = ParquetSource(tmp_path, columns=["id", "v", "c7"])
    assert len(merges) == 3
    assert source.schema().field("v").type == pa.int64()
    assert ids_of(source.read(85, 100)) == list(range(85, 100))
    batch = pa.Table.from_batches(source.read(90, 93))
    assert batch.column_names == ["id", "v", "c7"] and batch.column("v").to_pylist() == [90, 91, 92]
    _write(tmp_path, 39, 3, pa.float64(), wide=50)
    with pytest.raises(ConfigError, match=r"column 'v'.*part-039\.parquet"):
        ParquetSource(tmp_path)


def test_many_empty_files_make_one_warning(tmp_path):
    """Thousands of empty files among the others (a writer's empty partitions) are skipped
    with one warning naming the first three and counting the rest, not one each."""
    for index in range(30):
        _write(tmp_path, index, 0 if index % 3 else 2, pa.int64())
    with pytest.warns(UserWarning) as caught:
        source = ParquetSource(tmp_path)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.endswith("part-004.parquet and 17 more hold no rows; skipping them")
    assert source.layout().file_rows == (2,) * 10


class _MeetingSource(ParquetSource):
    """Reads a footer only once another thread reads one too (a barrier, so footers read
    one after another break it instead of passing)."""

    meeting = threading.Barrier(2, timeout=30)

    def _inspect(self, fs, path, display):
        if path.endswith(("part-000.parquet", "part-001.parquet")):
            self.meeting.wait()
        return super()._inspect(fs, path, display)


def test_footers_are_read_in_threads_and_the_first_bad_file_is_named(tmp_path):
    """Footers are read several at a time (20 ms a footer on an object store made 200
    files take 4.2 s one by one, 0.3 s now); the error still names the first bad file."""
    for index in range(12):
        _write(tmp_path, index, 2, pa.int64())
    source = _MeetingSource(tmp_path)
    assert ids_of(source.read(0, 24)) == list(range(24))
    for index in (9, 4):
        (tmp_path / f"part-{index:03d}.parquet").write_bytes(b"PAR1 not a footer")
    with pytest.raises(ConfigError, match=r"part-004\.parquet is not a readable Parquet"):
        ParquetSource(tmp_path)
