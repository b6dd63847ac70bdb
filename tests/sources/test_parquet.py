"""ParquetSource and ArrowFileSource on real files: layout from footers, exact reads,
projection, splits, pickling, filesystems."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parquet_fixtures import corrupt_row_group, ids_of, table_of, uneven_dataset, write_dataset

from rayshard.errors import DataError
from rayshard.plan import DataLayout
from rayshard.sources.arrow_files import ArrowFileSource
from rayshard.sources.parquet import ParquetSource


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uneven")
    uneven_dataset(folder)
    return folder


def test_layout_comes_from_the_footers(uneven):
    source = ParquetSource(uneven)
    layout = source.layout()
    assert layout.num_samples == 112
    assert layout.file_rows == (23, 40, 9, 31, 9)
    assert len(source.files) == 5 and source.files[0].endswith("part-000.parquet")
    assert source.stats()["chunks_read"] == 0  # nothing decoded to plan
    assert source.schema().names == ["id", "value", "label"]


def test_splits_are_row_groups_and_can_be_cut(uneven):
    source = ParquetSource(uneven)
    splits = source.splits()
    assert splits[:4] == [(0, 7), (7, 14), (14, 21), (21, 23)]
    assert sum(b - a for a, b in splits) == 112
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(splits, splits[1:]))
    groups = source.row_groups()
    assert [(s, e) for _, _, s, e in groups] == splits
    cut = source.splits(split_rows=3)
    assert max(b - a for a, b in cut) == 3
    assert sum(b - a for a, b in cut) == 112
    assert ParquetSource(uneven, split_rows=5).splits() == source.splits(5)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_range_reads_exactly_its_rows(uneven, data):
    source = ParquetSource(uneven)
    start = data.draw(st.integers(0, 112))
    end = data.draw(st.integers(start, 112))
    assert ids_of(source.read(start, end)) == list(range(start, end))


def test_read_touches_only_overlapping_row_groups(uneven):
    source = ParquetSource(uneven)
    # file 1 starts at 23 with row groups of 7: [23,30) [30,37) ...
    assert ids_of(source.read(31, 36)) == list(range(31, 36))
    assert source.stats()["chunks_read"] == 1
    source = ParquetSource(uneven)  # nothing kept decoded (see test_decoded_chunks.py)
    # [14,21) [21,23) of file 0, then [23,30) [30,37) of file 1
    assert ids_of(source.read(20, 31)) == list(range(20, 31))
    assert source.stats()["chunks_read"] == 4
    source.reset_stats()
    assert list(source.read(50, 50)) == []
    assert source.stats()["chunks_read"] == 0


def test_column_projection(uneven):
    source = ParquetSource(uneven, columns=["id", "label"])
    assert source.schema().names == ["id", "label"]
    batches = list(source.read(0, 30))
    assert all(b.schema.names == ["id", "label"] for b in batches)
    only = list(source.read(0, 30, columns=["label"]))
    assert all(b.schema.names == ["label"] for b in only)
    assert [v for b in only for v in b.column("label").to_pylist()] == [f"s{i}" for i in range(30)]


def test_out_of_range_read_is_an_error(uneven):
    source = ParquetSource(uneven)
    with pytest.raises(ValueError, match=r"outside the dataset's \[0, 112\)"):
        list(source.read(100, 113))


def test_pickles_as_paths_and_metadata(uneven):
    source = ParquetSource(uneven)
    ids_of(source.read(0, 50))  # opens handles
    blob = pickle.dumps(source)
    assert len(blob) < 4000
    copy = pickle.loads(blob)
    assert copy.stats() == {"chunks_read": 0, "rows_decoded": 0, "files_opened": 0}
    assert ids_of(copy.read(40, 90)) == list(range(40, 90))
    assert copy.layout() == source.layout()


def test_folder_glob_list_uri_and_filesystem(tmp_path):
    paths = write_dataset(tmp_path / "d", [10, 12, 5], row_group_size=4)
    (tmp_path / "d" / "_SUCCESS").write_text("")
    (tmp_path / "d" / ".hidden").write_text("x")
    everything = list(range(27))
    assert ids_of(ParquetSource(tmp_path / "d").read(0, 27)) == everything
    assert ids_of(ParquetSource(str(tmp_path / "d" / "*.parquet")).read(0, 27)) == everything
    assert (
        ids_of(ParquetSource(str(tmp_path / "**" / "part-00[01].parquet")).read(0, 22))
        == (everything[:22])
    )
    # `**` skips hidden and `_` folders and names, as the folder's listing does (Spark's
    # uncommitted part files; they were read beside the committed ones)
    for staging in ("_temporary/0", ".spark-staging"):
        write_dataset(tmp_path / "d" / staging, [3], row_group_size=4)
    assert ParquetSource(str(tmp_path / "d" / "**" / "*.parquet")).layout().num_samples == 27
    assert ParquetSource(str(tmp_path / "d" / "**")).layout().num_samples == 27
    assert ids_of(ParquetSource(list(reversed(paths))).read(0, 5)) == list(range(22, 27))
    assert ParquetSource("file://" + paths[1]).layout().num_samples == 12
    sub = pafs.SubTreeFileSystem(str(tmp_path / "d"), pafs.LocalFileSystem())
    source = ParquetSource(["part-000.parquet", "part-002.parquet"], filesystem=sub)
    assert ids_of(pickle.loads(pickle.dumps(source)).read(0, 15)) == list(range(10)) + list(
        range(22, 27)
    )


def test_relative_paths_resolve_at_construction(tmp_path, monkeypatch):
    write_dataset(tmp_path / "d", [6], row_group_size=4)
    monkeypatch.chdir(tmp_path)
    source = ParquetSource("d")
    monkeypatch.chdir("/")
    assert ids_of(source.read(0, 6)) == list(range(6))


def test_corrupt_row_group_raises_after_delivering_earlier_batches(tmp_path):
    paths = write_dataset(tmp_path, [30, 30], row_group_size=7)
    corrupt_row_group(paths[0], 2)
    source = ParquetSource(paths)  # footers are intact: construction succeeds
    delivered = []
    with pytest.raises(DataError, match=r"part-000\.parquet: row group 2 is unreadable") as info:
        for batch in source.read(0, 60):
            delivered.extend(batch.column("id").to_pylist())
    assert delivered == list(range(14))
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args
    assert ids_of(source.read(21, 60)) == list(range(21, 60))  # the rest is readable


def test_arrow_ipc_files(tmp_path):
    feather.write_feather(table_of(range(0, 25)), tmp_path / "a.arrow", chunksize=10)
    feather.write_feather(table_of(range(25, 40)), tmp_path / "b.feather", chunksize=4)
    source = ArrowFileSource(tmp_path, columns=["id"])
    assert source.layout().file_rows == (25, 15)
    assert source.splits()[:4] == [(0, 10), (10, 20), (20, 25), (25, 29)]
    assert ids_of(source.read(8, 33)) == list(range(8, 33))
    assert source.stats()["chunks_read"] == 5
    assert source.schema().names == ["id"]
    assert ids_of(pickle.loads(pickle.dumps(source)).read(0, 40)) == list(range(40))


def test_compressed_arrow_files_decode_only_the_columns_asked_for(tmp_path):
    """Two writers, zstd and lz4: a read of two columns (asked in another order than the
    file's) gets exactly them, through a reader that decodes only those two."""
    import polars as pl

    wide = {"id": np.arange(30), **{f"c{i}": np.full(30, float(i)) for i in range(6)}}
    feather.write_feather(pa.table(wide).slice(0, 20), tmp_path / "a.arrow", "zstd", chunksize=8)
    pl.DataFrame(pa.table(wide).slice(20)).write_ipc(tmp_path / "b.arrow", compression="lz4")
    source = ArrowFileSource(tmp_path, columns=["c4", "id"])
    batches = list(source.read(5, 30))
    assert all(b.schema.names == ["c4", "id"] for b in batches)
    assert ids_of(batches) == list(range(5, 30))
    assert {x for b in batches for x in b.column("c4").to_pylist()} == {4.0}
    handle = source._handle(0)
    assert handle.reader(["c4", "id"]).get_batch(0).schema.names == ["id", "c4"]
    assert handle.reader(None).get_batch(0).num_columns == 7


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_files_ordering_their_columns_differently_read_in_one_order(tmp_path, kind):
    """Writers order columns as they please: every chunk comes in the dataset's order (the
    first file's), so batches of several files concatenate."""
    first = pa.table({"id": pa.array([0, 1, 2], pa.int64()), "x": [10.0, 11.0, 12.0]})
    second = pa.table({"x": [13.0, 14.0], "id": pa.array([3, 4], pa.int32())})  # promoted
    if kind == "parquet":
        pq.write_table(first, tmp_path / "a.parquet")
        pq.write_table(second, tmp_path / "b.parquet")
        source = ParquetSource(tmp_path)
    else:
        feather.write_feather(first, tmp_path / "a.arrow")
        feather.write_feather(second, tmp_path / "b.arrow")
        source = ArrowFileSource(tmp_path)
    assert source.schema().names == ["id", "x"]
    batches = list(source.read(0, 5))
    assert all(b.schema.names == ["id", "x"] for b in batches)
    table = pa.Table.from_batches(batches)  # one schema: they concatenate
    assert table.column("id").to_pylist() == [0, 1, 2, 3, 4]
    assert table.column("x").to_pylist() == [10.0, 11.0, 12.0, 13.0, 14.0]


def test_a_file_rewritten_after_the_source_was_made_is_a_data_error(tmp_path):
    """Fewer rows, or other columns, than the footer said when the source was made: a
    `DataError` naming the file, never fewer rows than counted or a raw `KeyError`."""
    paths = write_dataset(tmp_path, [6, 6], row_group_size=6)
    source = ParquetSource(tmp_path)
    pq.write_table(table_of(range(6, 9)), paths[1])  # 3 rows where there were 6
    assert ids_of(source.read(0, 6)) == list(range(6))
    with pytest.raises(DataError, match=r"part-001\.parquet: row group 0 has 3 rows, not as"):
        list(source.read(6, 12))
    assert ids_of(ParquetSource(tmp_path).read(0, 9)) == list(range(9))  # made again
    projected = ParquetSource(tmp_path, columns=["id", "value"])
    whole, unopened = ParquetSource(tmp_path), ParquetSource(tmp_path)
    pq.write_table(table_of(range(6, 9)).rename_columns(["id", "other", "label"]), paths[1])
    with pytest.raises(DataError, match=r"part-001\.parquet: row group 0 is unreadable.*missing"):
        list(projected.read(0, 9))
    with pytest.raises(DataError, match=r"part-001\.parquet: .*\['value'\] are missing"):
        list(whole.read(6, 9))
    pq.write_table(table_of(range(6, 9)).append_column("more", pa.array([1, 2, 3])), paths[1])
    with pytest.raises(DataError, match=r"part-001\.parquet: .*\['more'\] are not in the data"):
        list(unopened.read(6, 9))


def test_an_arrow_file_rewritten_without_a_column_is_a_data_error(tmp_path):
    feather.write_feather(pa.table({"id": [0, 1], "x": [1.0, 2.0]}), tmp_path / "a.arrow")
    source = ArrowFileSource(tmp_path, columns=["id", "x"])
    feather.write_feather(pa.table({"id": [0, 1], "y": [1.0, 2.0]}), tmp_path / "a.arrow")
    with pytest.raises(DataError, match=r"a\.arrow: record batch 0 is unreadable .*\"x\""):
        list(source.read(0, 2))


def test_large_row_group_split_reads_slices(tmp_path):
    path = tmp_path / "big.parquet"
    pq.write_table(table_of(range(1000)), path, row_group_size=1000)
    source = ParquetSource(path, split_rows=300)
    assert source.splits() == [(0, 300), (300, 600), (600, 900), (900, 1000)]
    for a, b in source.splits():
        assert ids_of(source.read(a, b)) == list(range(a, b))
    assert all(isinstance(b, pa.RecordBatch) for b in source.read(0, 10))
    assert os.path.basename(source.describe().split("(")[1].split(";")[0]) == "big.parquet"


def test_open_local_files_hold_no_row_group_after_a_read(tmp_path):
    """A process keeps its Parquet files open between reads. On a local disk none of them
    may keep the last row group's column chunks (pyarrow's pre-buffering does: one row
    group per open file, 250 MB over a reader's files in the loader benchmark): the Arrow
    memory allocated while they are open, less what stays once they are closed. Measured in
    a process of its own: Arrow's allocation counter is process-wide."""
    rng = np.random.default_rng(0)
    files, rows = 12, 4096
    for i in range(files):
        x = pa.array(rng.standard_normal(rows * 64, dtype=np.float32))
        table = pa.table(
            {
                "x": pa.FixedSizeListArray.from_arrays(x, 64),
                "id": pa.array(range(i * rows, (i + 1) * rows), pa.int64()),
            }
        )
        pq.write_table(table, tmp_path / f"part-{i}.parquet", row_group_size=rows)
    probe = (
        "import gc, sys, pyarrow as pa\n"
        "from rayshard.sources.parquet import ParquetSource\n"
        "source = ParquetSource(sys.argv[1])\n"
        "rows = sum(batch.num_rows for batch in source.read(0, source.layout().num_samples))\n"
        "opened, open_held = source.stats()['files_opened'], pa.total_allocated_bytes()\n"
        "del source\n"
        "gc.collect()\n"
        "print(rows, opened, open_held, pa.total_allocated_bytes())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    read, opened, open_held, closed_held = map(int, done.stdout.split())
    assert read == files * rows
    assert opened == files  # all still open, in the handle cache
    held = open_held - closed_held  # what the open files hold
    # Pre-buffering keeps every open file's last row group as stored: all of `stored` here
    # (one row group per file). Without it, up to 1.2 MB was seen held in full suite runs
    # (never alone; the cause is not known): the bound is half of `stored`.
    stored = 0
    for path in tmp_path.glob("*.parquet"):
        group = pq.ParquetFile(path).metadata.row_group(0)
        stored += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
    assert held < stored / 2, (
        f"{held:,} bytes of Arrow memory held by the open files ({open_held:,} allocated with "
        f"them open, {closed_held:,} once closed; the files' row groups: {stored:,} bytes)"
    )


def test_reads_look_files_up_in_offsets_computed_once(tmp_path):
    """Every read finds its file in the layout's offsets: built once per layout, not per
    read (20,000 files: 0.8 ms a read, 3x an epoch's reading time), and never pickled."""
    write_dataset(tmp_path, [3] * 200, row_group_size=2)
    source = ParquetSource(tmp_path)
    offsets = source.layout().offsets
    for a, b in source.splits():
        assert ids_of(source.read(a, b)) == list(range(a, b))
    assert source.layout().offsets is offsets
    assert len(pickle.dumps(source.layout())) == len(pickle.dumps(DataLayout.of_files([3] * 200)))
    assert pickle.loads(pickle.dumps(source)).layout().offsets == offsets


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_reads_find_their_first_row_group_among_many(tmp_path_factory, data):
    """A read starts at the row group holding its first row, found in row-group starts
    computed once per file (a walk from the file's first row group made every read of a
    file of 4,000 row groups cost 4,000 steps); empty row groups are passed over."""
    folder = tmp_path_factory.mktemp("groups")
    sizes = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=30))
    writer = pq.ParquetWriter(folder / "a.parquet", table_of([0]).schema)
    start = 0
    for rows in sizes:
        writer.write_table(table_of(range(start, start + rows)))
        start += rows
    writer.write_table(table_of(range(start, start + 1)))
    writer.close()
    source = ParquetSource(folder)
    lo = data.draw(st.integers(0, start + 1))
    hi = data.draw(st.integers(lo, start + 1))
    assert ids_of(source.read(lo, hi)) == list(range(lo, hi))
    overlapping = [g for _, g, a, b in source.row_groups() if max(a, lo) < min(b, hi)]
    assert source.stats()["chunks_read"] == len(overlapping)
    file = source._files[0]
    assert file.chunk_starts is file.chunk_starts
    assert "chunk_starts" not in pickle.loads(pickle.dumps(file)).__dict__


def test_a_mapped_arrow_file_cut_shorter_in_place_is_a_data_error_not_a_crash(tmp_path):
    """`cp` over a memory-mapped file truncates it in place: a read past its new end would
    kill the process with SIGBUS. Run in a child process, so a crash fails the test only."""
    script = f"""
import shutil, numpy as np, pyarrow as pa, pyarrow.feather as feather
from rayshard.errors import DataError
from rayshard.sources.arrow_files import ArrowFileSource
big, small = {str(tmp_path / "big.arrow")!r}, {str(tmp_path / "small.arrow")!r}
feather.write_feather(pa.table({{"id": np.arange(100_000)}}), big, chunksize=10_000)
feather.write_feather(pa.table({{"id": np.arange(10)}}), small)
source = ArrowFileSource(big)
delivered = sum(batch.num_rows for batch in source.read(0, 20_000))
shutil.copyfile(small, big)
try:
    list(source.read(20_000, 100_000))
except DataError as error:
    print(delivered, error)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith("20000 ") and "big.arrow: record batch 2" in done.stdout
    assert "cut shorter in place" in done.stdout


def test_arrow_reads_of_partition_columns_only_and_of_a_file_renamed_over(tmp_path):
    """Only a partition column asked for: the rows, counted (it raised `IndexError`). A
    file replaced by a rename keeps the mapping it was opened with: no false shortening."""
    folder = tmp_path / "year=2020"
    folder.mkdir()
    feather.write_feather(table_of(range(6)), folder / "a.arrow", chunksize=3)
    source = ArrowFileSource(tmp_path)
    batches = list(source.read(0, 6, ["year"]))
    assert sum(b.num_rows for b in batches) == 6 and batches[0].schema.names == ["year"]
    assert ids_of(source.read(0, 3)) == [0, 1, 2]  # opened (mapped) now
    feather.write_feather(table_of(range(2)), tmp_path / "short.arrow")
    os.replace(tmp_path / "short.arrow", folder / "a.arrow")
    assert ids_of(source.read(3, 6)) == [3, 4, 5]
