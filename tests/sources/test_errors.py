"""Start-up errors of file sources: each names the file and what to do."""

from __future__ import annotations

import pickle
import re
import warnings

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from parquet_fixtures import ids_of, table_of, truncate, write_dataset

from rayshard.errors import ConfigError, DataError
from rayshard.sources.arrow_files import ArrowFileSource
from rayshard.sources.base import TableSource
from rayshard.sources.parquet import ParquetSource


def test_missing_file_is_named(tmp_path):
    paths = write_dataset(tmp_path, [5])
    missing = str(tmp_path / "nope.parquet")
    with pytest.raises(ConfigError, match="nope.parquet: no such file"):
        ParquetSource([paths[0], missing])


def test_config_error_is_a_value_error(tmp_path):
    with pytest.raises(ValueError):
        ParquetSource(tmp_path / "missing")


def test_truncated_file_is_named(tmp_path):
    paths = write_dataset(tmp_path, [20, 20])
    truncate(paths[1])
    with pytest.raises(ConfigError, match=r"part-001\.parquet is not a readable Parquet file"):
        ParquetSource(tmp_path)


def test_non_parquet_file_in_the_folder(tmp_path):
    write_dataset(tmp_path, [5, 5])
    (tmp_path / "notes.txt").write_text("hello, not parquet")
    with pytest.raises(ConfigError, match=r"notes\.txt is not a Parquet file"):
        ParquetSource(tmp_path)
    # a glob that names only the Parquet files works
    assert ParquetSource(str(tmp_path / "*.parquet")).layout().num_samples == 10


@pytest.mark.parametrize("relative", [False, True])
def test_errors_under_a_glob_name_the_file_as_the_user_named_its_folder(
    tmp_path, monkeypatch, relative
):
    """Each error names the real file, written as the glob's folder was written (absolute,
    or relative to the working folder), not the glob."""
    folder = tmp_path / "data"
    folder.mkdir()
    write_dataset(folder, [5, 5])
    table = table_of(range(10, 15)).set_column(1, "value", pa.array(["a"] * 5))
    pq.write_table(table, folder / "part-002.parquet")
    if relative:
        monkeypatch.chdir(tmp_path)
    glob = "data/*.parquet" if relative else str(folder / "*.parquet")
    named = "data" if relative else str(folder)
    with pytest.raises(ConfigError) as info:
        ParquetSource(glob)
    message = str(info.value)
    assert f"{named}/part-000.parquet" in message and f"{named}/part-002.parquet" in message
    assert "*" not in message
    (folder / "part-002.parquet").unlink()
    source = ParquetSource(glob)
    assert source.files == [f"{named}/part-000.parquet", f"{named}/part-001.parquet"]
    (folder / "part-001.parquet").unlink()  # gone after the source was made
    with pytest.raises(DataError, match=rf"^{named}/part-001\.parquet: cannot open the file"):
        list(source.read(0, 10))


def test_tiny_non_parquet_file(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PA")
    with pytest.raises(ConfigError, match=r"x\.parquet is not a Parquet file"):
        ParquetSource(tmp_path)


def test_schemas_that_disagree_name_both_files_and_the_field(tmp_path):
    write_dataset(tmp_path, [5, 5])
    table = table_of(range(10, 15)).set_column(1, "value", pa.array(["a"] * 5))
    pq.write_table(table, tmp_path / "part-002.parquet")
    with pytest.raises(ConfigError) as info:
        ParquetSource(tmp_path)
    message = str(info.value)
    assert "part-000.parquet" in message and "part-002.parquet" in message
    assert "'value'" in message and "double" in message and "string" in message


def test_missing_field_in_one_file(tmp_path):
    write_dataset(tmp_path, [5])
    pq.write_table(table_of(range(5, 8)).drop_columns(["label"]), tmp_path / "part-001.parquet")
    with pytest.raises(ConfigError, match=r"part-000\.parquet has field 'label'.*part-001"):
        ParquetSource(tmp_path)


def test_extra_field_in_one_file(tmp_path):
    write_dataset(tmp_path, [5])
    table = table_of(range(5, 8)).append_column("more", pa.array([1, 2, 3]))
    pq.write_table(table, tmp_path / "part-001.parquet")
    with pytest.raises(ConfigError, match=r"extra fields \['more'\]"):
        ParquetSource(tmp_path)


def test_unknown_column_lists_the_available_ones(tmp_path):
    write_dataset(tmp_path, [5])
    with pytest.raises(ConfigError, match=r"\['nope'\].*available columns are \['id', 'value'"):
        ParquetSource(tmp_path, columns=["id", "nope"])
    source = ParquetSource(tmp_path, columns=["id"])
    with pytest.raises(ConfigError, match="available columns are"):
        list(source.read(0, 5, columns=["value"]))


def test_empty_dataset(tmp_path):
    pq.write_table(table_of([]), tmp_path / "empty.parquet")
    with pytest.warns(UserWarning), pytest.raises(ConfigError, match="the dataset has no rows"):
        ParquetSource(tmp_path)
    (tmp_path / "empty.parquet").unlink()
    (tmp_path / "sub").mkdir()
    with pytest.raises(ConfigError, match="holds no Parquet files"):
        ParquetSource(tmp_path / "sub")
    with pytest.raises(ConfigError, match="matches no file"):
        ParquetSource(str(tmp_path / "*.parquet"))
    with pytest.raises(ConfigError, match="no paths given"):
        ParquetSource([])


def test_zero_row_files_are_skipped_with_a_warning(tmp_path):
    write_dataset(tmp_path, [6, 0, 4])
    with pytest.warns(UserWarning, match=r"part-001\.parquet holds no rows; skipping it"):
        source = ParquetSource(tmp_path)
    assert source.layout().file_rows == (6, 4)
    assert ids_of(source.read(0, 10)) == list(range(10))


def test_bad_split_rows(tmp_path):
    write_dataset(tmp_path, [5])
    with pytest.raises(ConfigError, match="split_rows=0"):
        ParquetSource(tmp_path, split_rows=0)


def test_file_deleted_after_planning_is_a_data_error(tmp_path):
    paths = write_dataset(tmp_path, [5, 5])
    source = pickle.loads(pickle.dumps(ParquetSource(tmp_path)))
    (tmp_path / paths[1]).unlink()
    with pytest.raises(DataError, match=r"part-001\.parquet: cannot open the file"):
        list(source.read(0, 10))


def test_arrow_errors(tmp_path):
    feather.write_feather(table_of(range(5)), tmp_path / "a.arrow")
    (tmp_path / "b.arrow").write_bytes(b"garbage")
    with pytest.raises(ConfigError, match=r"b\.arrow is not a readable Arrow IPC file"):
        ArrowFileSource(tmp_path)


def test_no_warning_for_a_clean_dataset(tmp_path):
    write_dataset(tmp_path, [5, 5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ParquetSource(tmp_path)


@pytest.mark.parametrize(
    ("paths", "given"),
    [(5, "paths=5 (a int)"), ([5], "5 (a int) in paths"), ({"a": 1}, "paths={'a': 1} (a dict)")],
)
def test_paths_that_are_not_paths_are_refused_naming_them(paths, given):
    with pytest.raises(ConfigError, match=re.escape(f"Parquet source: {given} is not a path")):
        ParquetSource(paths)


def test_table_source_needs_a_pyarrow_table():
    with pytest.raises(ConfigError, match=r"got a builtins.dict; it takes a pyarrow.Table"):
        TableSource({"x": [1, 2, 3]})
    assert TableSource(pa.table({"x": [1, 2, 3]})).layout().num_samples == 3


def test_a_row_group_a_filter_cannot_decode_is_named(tmp_path):
    import pyarrow.compute as pc

    path = tmp_path / "part-1.parquet"
    pq.write_table(
        pa.table({"id": list(range(1000))}), path, row_group_size=250, compression="none"
    )
    data = bytearray(path.read_bytes())
    for k in range(200, len(data) // 2, 7):  # its data pages, not its footer
        data[k] = 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(
        ConfigError,
        match=r"part-1\.parquet: row group 0 is unreadable while "
        r"filter= is evaluated \((?s:.*)\): fix or remove the file",
    ):
        ParquetSource([str(path)], filter=pc.field("id") >= 0)


def test_a_conflict_after_a_promotion_names_the_file_that_promoted(tmp_path):
    pq.write_table(pa.table({"a": pa.array([1], pa.int32())}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"a": pa.array([1], pa.int64())}), tmp_path / "2.parquet")
    pq.write_table(pa.table({"a": pa.array(["x"])}), tmp_path / "3.parquet")
    with pytest.raises(
        ConfigError,
        match=r"int64 in \S*1\.parquet \(as promoted by \S*2\.parquet\)"
        r" but string in \S*3\.parquet",
    ):
        ParquetSource(tmp_path)  # (int64 is not 1.parquet's type: it holds int32)


def test_a_table_source_read_outside_its_rows_or_of_an_unknown_column_is_refused():
    source = TableSource(pa.table({"x": list(range(9))}))
    for start, end in ((5, 20), (7, 3), (-1, 2)):  # (a shorter slice or nothing, silently)
        with pytest.raises(ValueError, match=r"rows \[.*\) are outside the table's \[0, 9\)"):
            list(source.read(start, end))
    with pytest.raises(ConfigError, match=r"columns \['y'\] are not in the table"):
        list(source.read(0, 2, ["y"]))
    assert [b.num_rows for b in source.read(2, 9, ["x"])] == [7]
