"""Columns as other writers type them, across the files of one dataset: a column of only
nulls (pandas, polars), dictionary-encoded strings (pandas' categoricals with index widths
by size, pyarrow) against plain strings (fastparquet, polars), structs, decimals and view
strings (polars, duckdb, pyarrow); a `filter=` on a float column with NaN (Parquet
statistics leave NaN out); a null Hive partition; the columns in the order asked for;
overlapping paths and hidden side files. Real files in a temp folder; the promotions also
as pure functions."""

from __future__ import annotations

import decimal
import math

import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from real_data import epoch

from rayshard.errors import ConfigError
from rayshard.loader import Loader
from rayshard.sources.arrow_files import ArrowFileSource
from rayshard.sources.parquet import ParquetSource
from rayshard.sources.schema import promote_type
from tests.runtime.helpers import unique_name


def _rows(source: ParquetSource) -> dict:
    num = source.layout().num_samples
    return pa.Table.from_batches(list(source.read(0, num)), schema=source.schema()).to_pydict()


def test_null_and_dictionary_types_promote():
    text = pa.dictionary(pa.int8(), pa.string())
    assert promote_type(pa.null(), pa.large_string()) == pa.large_string()
    assert promote_type(pa.int64(), pa.null()) == pa.int64()
    assert promote_type(text, pa.dictionary(pa.int16(), pa.string())) == pa.string()
    assert promote_type(text, pa.large_string()) == pa.large_string()
    assert promote_type(pa.string(), text) == pa.string()
    assert promote_type(text, pa.int64()) is None  # another kind of value: refused
    assert promote_type(text, pa.dictionary(pa.int8(), pa.int32())) is None


@pytest.mark.parametrize("writer", ["pandas", "polars"])
def test_a_column_of_only_nulls_in_one_file_takes_the_others_type(tmp_path, writer):
    if writer == "pandas":
        pd.DataFrame({"x": [1, 2], "c": [None, None]}).to_parquet(tmp_path / "a.parquet")
    else:
        pl.DataFrame({"x": [1, 2], "c": [None, None]}).write_parquet(tmp_path / "a.parquet")
    pl.DataFrame({"x": [3], "c": ["q"]}).write_parquet(tmp_path / "b.parquet")
    source = ParquetSource(tmp_path)
    assert source.schema().field("c").type == pa.large_string()
    assert _rows(source) == {"x": [1, 2, 3], "c": [None, None, "q"]}


def test_categoricals_read_as_their_plain_values_across_files(tmp_path):
    pd.DataFrame({"c": pd.Categorical(["x", "y"])}).to_parquet(tmp_path / "a.parquet")  # int8
    many = [f"v{i}" for i in range(300)]  # 300 categories: int16 indices
    pd.DataFrame({"c": pd.Categorical(many)}).to_parquet(tmp_path / "b.parquet")
    others = [f"w{i}" for i in range(100)]  # int8 again: with "b" more than int8 holds
    pd.DataFrame({"c": pd.Categorical(others)}).to_parquet(tmp_path / "c.parquet")
    pd.DataFrame({"c": ["z"]}).to_parquet(tmp_path / "d.parquet", engine="fastparquet")
    source = ParquetSource(tmp_path)  # (d: a plain string column from another writer)
    assert source.schema().field("c").type == pa.string()
    assert _rows(source)["c"] == ["x", "y", *many, *others, "z"]
    one_batch = pa.Table.from_batches(list(source.read(2, 403))).combine_chunks()
    assert one_batch.column("c").to_pylist() == [*many, *others, "z"]  # as a batch joins them


@pytest.mark.parametrize("writer", ["pyarrow", "polars"])
def test_a_filter_on_a_float_column_keeps_its_nan_rows(tmp_path, writer):
    values = [1.0, math.nan, 2.0, 3.0, 1.0, 1.0]
    if writer == "pyarrow":
        pq.write_table(pa.table({"f": values}), tmp_path / "a.parquet", row_group_size=2)
    else:
        pl.DataFrame({"f": values}).write_parquet(tmp_path / "a.parquet", row_group_size=2)
    # the first row group's statistics say min = max = 1.0: they leave the NaN out
    kept = _rows(ParquetSource(tmp_path, filter=pc.field("f") != 1.0))["f"]
    assert kept[0] != kept[0] and kept[1:] == [2.0, 3.0]  # NaN != 1.0 holds for the NaN
    assert len(_rows(ParquetSource(tmp_path, filter=pc.field("f").is_nan()))["f"]) == 1
    by_position = _rows(ParquetSource(tmp_path, filter=pc.field(0) != 1.0))["f"]
    assert len(by_position) == 3  # a positional reference: the NaN row kept too


def test_a_filter_on_a_float_inside_a_struct_keeps_its_nan_rows(tmp_path):
    values = pa.array([1.0, math.nan, 2.0, 3.0, 1.0, 1.0])
    structs = pa.StructArray.from_arrays([values], names=["f"])
    pq.write_table(pa.table({"s": structs}), tmp_path / "a.parquet", row_group_size=2)
    kept = _rows(ParquetSource(tmp_path, filter=pc.field("s", "f") != 1.0))["s"]
    assert len(kept) == 3  # the NaN, 2.0 and 3.0


def test_batches_have_the_columns_in_the_order_asked_for(tmp_path):
    pq.write_table(pa.table({"x": [1, 2], "y": [3, 4], "z": [5, 6]}), tmp_path / "a.parquet")
    source = ParquetSource(tmp_path, columns=["z", "x"])
    assert source.schema().names == ["z", "x"]
    assert [batch.schema.names for batch in source.read(0, 2)] == [["z", "x"]]
    assert _rows(source) == {"z": [5, 6], "x": [1, 2]}


def test_overlapping_paths_are_refused_and_globs_skip_hidden_names(tmp_path):
    (tmp_path / "sub").mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": [3]}), tmp_path / "sub" / "b.parquet")
    folders = [tmp_path, tmp_path / "sub"]  # b.parquet twice
    globs = [f"{tmp_path}/*.parquet", f"{tmp_path}/**/*.parquet"]  # a.parquet twice
    for paths, named in ((folders, "b.parquet"), (globs, "a.parquet")):
        with pytest.raises(ConfigError, match=rf"{named} is named twice"):
            ParquetSource(paths)
    (tmp_path / ".a.parquet.crc").write_bytes(b"checksum")  # a Spark/Hadoop side file
    assert _rows(ParquetSource(f"{tmp_path}/*")) == {"x": [1, 2]}
    assert ParquetSource(f"{tmp_path}/**/*.parquet").layout().num_samples == 3


def test_a_null_hive_partition_is_a_null_of_the_keys_type(tmp_path):
    # pyarrow (as Hive and Spark) writes a null partition value as p=__HIVE_DEFAULT_PARTITION__
    table = pa.table({"x": [1, 2, 3, 4], "p": pa.array([1, 2, None, 1], pa.int64())})
    pq.write_to_dataset(table, tmp_path, partition_cols=["p"])
    source = ParquetSource(tmp_path)
    assert source.schema().field("p").type == pa.int64()
    rows = _rows(source)
    assert sorted(zip(rows["x"], rows["p"]), key=str) == sorted(
        [(1, 1), (2, 2), (3, None), (4, 1)], key=str
    )
    assert _rows(ParquetSource(tmp_path, filter=pc.field("p").is_null())) == {
        "x": [3],
        "p": [None],
    }
    kept = _rows(ParquetSource(tmp_path, filter=pc.field("x") > 2))  # row-group statistics
    assert sorted(zip(kept["x"], kept["p"]), key=str) == sorted([(3, None), (4, 1)], key=str)


def test_structs_decimals_and_view_strings_of_other_writers_read_as_one_column(tmp_path):
    import duckdb

    structs, decimals, ipc = (tmp_path / n for n in ("structs", "decimals", "ipc"))
    for folder in (structs, decimals, ipc):
        folder.mkdir()
    pl.DataFrame({"s": [{"a": "x", "n": 1}]}).write_parquet(structs / "a.parquet")  # large
    s = pa.array([{"a": "y", "n": 2}], pa.struct([("a", pa.string()), ("n", pa.int32())]))
    pq.write_table(pa.table({"s": s}), structs / "b.parquet")
    assert _rows(ParquetSource(structs))["s"] == [{"a": "x", "n": 1}, {"a": "y", "n": 2}]

    duckdb.sql(
        f"COPY (SELECT 1.25::DECIMAL(5, 2) AS d) TO '{decimals / 'a.parquet'}' (FORMAT parquet)"
    )
    wide = pa.array([decimal.Decimal("12345678.50")], pa.decimal128(10, 2))
    pq.write_table(pa.table({"d": wide}), decimals / "b.parquet")
    source = ParquetSource(decimals)
    assert source.schema().field("d").type == pa.decimal128(10, 2)
    assert [str(v) for v in _rows(source)["d"]] == ["1.25", "12345678.50"]

    pl.DataFrame({"t": ["u"]}).write_ipc(ipc / "a.arrow")  # string_view
    plain = pa.table({"t": ["v"]})
    with pa.ipc.new_file(ipc / "b.arrow", plain.schema) as writer:
        writer.write_table(plain)
    source = ArrowFileSource(ipc)
    assert source.schema().field("t").type == pa.large_string()
    num = source.layout().num_samples
    assert pa.Table.from_batches(list(source.read(0, num))).column("t").to_pylist() == ["u", "v"]


@pytest.mark.ray
def test_nulls_of_a_view_string_column_are_filled(ray_session, tmp_path):
    pl.DataFrame({"t": ["a", None, "c"], "id": [0, 1, 2]}).write_ipc(tmp_path / "a.arrow")
    source = ArrowFileSource(tmp_path)
    with pytest.raises(ConfigError, match="fill_null"):
        Loader(source, batch_size=3, name=unique_name("view"), fill_null={"t": 5})
    loader = Loader(source, batch_size=3, name=unique_name("view"), fill_null={"t": "?"})
    try:
        (batch,) = epoch(loader, batch_format="numpy")
        assert list(batch["t"]) == ["a", "?", "c"]
    finally:
        loader.shutdown()


@pytest.mark.ray
@pytest.mark.parametrize("consumer_reads", [True, False])
def test_arrow_batches_keep_the_sources_types_in_every_batch(ray_session, tmp_path, consumer_reads):
    """`batch_format="arrow"` builds structs, decimals, lists of lists, zoned timestamps,
    dates and fixed-size binary with the source's types (inferred, they differed from
    batch to batch: decimal precision from the values, an empty list's `null` items, the
    zone dropped), so the epoch's batches make one table equal to the file's."""
    n = 20
    table = pa.table(
        {
            "price": pa.array(
                [decimal.Decimal(f"{i}.25") * 10**i for i in range(n)], pa.decimal128(28, 2)
            ),
            "when": pa.array(
                [1_700_000_000_000_000 + i for i in range(n)], pa.timestamp("us", tz="Europe/Paris")
            ),
            "meta": pa.array(
                [{"id": i % 100, "w": i / 2} for i in range(n)],
                pa.struct([("id", pa.int8()), ("w", pa.float32())]),
            ),
            "spans": pa.array(
                [[[i] * (i % 3)] * (i % 2) for i in range(n)], pa.list_(pa.list_(pa.int32()))
            ),
            "tags": pa.array([["t"] * (i % 2) for i in range(n)], pa.list_(pa.string())),
            "sha": pa.array([bytes([i]) * 4 for i in range(n)], pa.binary(4)),
        }
    )
    pq.write_table(table, tmp_path / "typed.parquet", row_group_size=5)
    loader = Loader(
        ParquetSource([str(tmp_path / "typed.parquet")]),
        batch_size=3,
        consumer_reads=consumer_reads,
        name=unique_name("arrow-types"),
    )
    try:
        batches = epoch(loader, batch_format="arrow")
    finally:
        loader.shutdown()
    got = pa.Table.from_batches(batches)  # one schema in every batch
    assert got.select(table.column_names).schema == table.schema
    order = pc.sort_indices(got, [("_index", "ascending")])
    assert got.take(order).select(table.column_names).equals(table)


@pytest.mark.ray
def test_a_timestamp_column_under_torch_is_refused_at_iterator(ray_session, tmp_path):
    pl.DataFrame({"x": [1.0, 2.0], "when": [0, 1]}).with_columns(
        pl.col("when").cast(pl.Datetime("us"))
    ).write_parquet(tmp_path / "dates.parquet")
    loader = Loader(
        ParquetSource([str(tmp_path / "dates.parquet")]), batch_size=2, name=unique_name("dates")
    )
    try:
        with pytest.raises(ConfigError, match=r"column 'when' .* cannot become a torch tensor"):
            loader.iterator(world_rank=0, world_size=1)  # before the rank registers
        batch = next(iter(loader.iterator(world_rank=0, world_size=1, batch_format="numpy")))
        assert batch["when"].dtype.kind == "M"
    finally:
        loader.shutdown()


def test_a_filter_or_split_rows_is_part_of_what_the_loaders_id_knows(tmp_path):
    """A state of a loader over the same files with another filter (other rows) or
    `split_rows` (other splits, other `dynamic` queues) is another loader's; without
    them the description says neither (the files: `tests/sources/test_file_ids.py`)."""
    from rayshard.config.loader_config import LoaderConfig

    pq.write_table(pa.table({"id": list(range(100))}), tmp_path / "a.parquet", row_group_size=10)
    path = [str(tmp_path / "a.parquet")]
    low = pc.field("id") < 50
    sources = [
        ParquetSource(path),
        ParquetSource(path, split_rows=5),
        ParquetSource(path, filter=low),
        ParquetSource(path, filter=~low),
    ]
    assert sources[0].describe().startswith("ParquetSource(a.parquet; 100 rows; files ")
    assert sources[0].describe().endswith(")") and "=" not in sources[0].describe()
    ids = {LoaderConfig().fingerprint(s.describe(), s.layout().num_samples) for s in sources}
    assert len(ids) == 4
