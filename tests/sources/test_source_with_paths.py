"""`paths` and `source_format` say which files the loader opens when it makes the source;
given alongside a source made otherwise they must be that source's own, or they would be
ignored without a word: refused with a `ConfigError`, before Ray starts."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parquet_fixtures import write_dataset

from rayshard.config.checked import checked_config
from rayshard.errors import ConfigError
from rayshard.loader import Loader
from rayshard.sources import TableSource
from rayshard.sources.arrow_files import ArrowFileSource
from rayshard.sources.parquet import ParquetSource


def _check(source, **options):
    return checked_config(source, None, {"batch_size": 4, **options}, None)


def test_paths_other_than_the_sources_are_refused(tmp_path, monkeypatch):
    a = write_dataset(tmp_path / "a", [10, 12])
    b = write_dataset(tmp_path / "b", [9])
    with pytest.raises(ConfigError, match=r"paths=.*b/part-000.parquet.* made from .*a/part"):
        Loader(ParquetSource(a), paths=b)
    with pytest.raises(ConfigError, match=r"the source would be read, paths ignored"):
        _check(ParquetSource(a), paths=a[:1])  # a file of the source left out
    with pytest.raises(ConfigError, match=r"leave paths out"):
        _check(ParquetSource(a), paths=a[::-1])
    monkeypatch.chdir(tmp_path)  # the same files, spelled otherwise: compared as given
    with pytest.raises(ConfigError, match=r"paths=\['a'\]"):
        _check(ParquetSource(str(tmp_path / "a")), paths=["a"])


def test_paths_the_source_was_made_from_are_accepted(tmp_path):
    """As `Loader.from_config` makes the source from `paths`, then checks the two: also
    with a filter that drops files and an empty file skipped (nothing listed again)."""
    import pyarrow.compute as pc

    a = write_dataset(tmp_path / "a", [10, 12])
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "a" / "part-009.parquet")
    folder = str(tmp_path / "a")
    with pytest.warns(UserWarning, match="holds no rows"):
        source = ParquetSource(folder)  # the empty file is skipped
    assert _check(source, paths=[folder]).paths == (folder,)
    filtered = ParquetSource(a, filter=pc.field("id") >= 10)  # the first file's rows dropped
    assert _check(filtered, paths=a, source_format="parquet").source_format == "parquet"


def test_paths_with_a_source_that_reads_no_paths_are_refused(tmp_path):
    a = write_dataset(tmp_path / "a", [10])
    with pytest.raises(ConfigError, match=r"which reads no paths: the source would be read"):
        _check(TableSource(pa.table({"id": list(range(8))})), paths=a)


def test_a_source_format_other_than_the_sources_class_is_refused(tmp_path):
    a = write_dataset(tmp_path / "a", [10])
    with pytest.raises(ConfigError, match=r"source_format='arrow' applies .* ArrowFileSource"):
        Loader(ParquetSource(a), source_format="arrow")
    arrow = tmp_path / "x.arrow"
    with pa.ipc.new_file(arrow, pa.schema([("id", pa.int64())])) as writer:
        writer.write_table(pa.table({"id": list(range(6))}))
    with pytest.raises(ConfigError, match=r"source_format='parquet' .* pass a ParquetSource"):
        _check(ArrowFileSource(str(arrow)), source_format="parquet")
    assert _check(ArrowFileSource(str(arrow)), source_format="arrow").source_format == "arrow"


def test_yaml_paths_with_another_source_are_refused_by_from_config(tmp_path):
    a = write_dataset(tmp_path / "a", [10])
    b = write_dataset(tmp_path / "b", [9])
    config = tmp_path / "loader.yaml"
    config.write_text(f"batch_size: 4\npaths: [{b[0]}]\n")
    with pytest.raises(ConfigError, match=r"paths=.*b/part-000.parquet"):
        Loader.from_config(str(config), source=ParquetSource(a))
