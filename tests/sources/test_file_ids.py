"""What a file source's loader id knows: every file's name under the dataset's root and
its row count, in order; not where the dataset lives. A saved state is checked against
it, as the loader and its coordinator check one (`rayshard.loader`, `core.coordination`):
a state saved over other files of the same row count is refused; the same files in a
moved folder resume; a state saved by an older rayshard (whose id knew only the first
file and the counts) still resumes over its files."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
from click.testing import CliRunner
from parquet_fixtures import write_dataset

from rayshard.cli import main
from rayshard.config.loader_config import LoaderConfig
from rayshard.core.state import LoaderState
from rayshard.errors import ConfigError
from rayshard.sources.arrow_files import ArrowFileSource
from rayshard.sources.mixed import MixedSource
from rayshard.sources.parquet import ParquetSource

SETTINGS = LoaderConfig(batch_size=5)


def identity(source, name="train", description=None):
    """(loader id, made_by) as `Loader` and its coordinator compute them for `source`."""
    described = source.describe() if description is None else description
    rows = source.layout().num_samples
    return (
        f"{name}:{SETTINGS.fingerprint(described, rows)}",
        SETTINGS.identity_facts(described, rows),
    )


def saved_state(source, **identity_options) -> dict:
    """A state saved mid-epoch by a loader over `source` (half its rows received)."""
    loader, made_by = identity(source, **identity_options)
    rows = source.layout().num_samples
    state = LoaderState(loader, 0, 0, ((0, rows // 2),), 2, rows, made_by=json.dumps(made_by))
    return state.to_dict()


def restore(state: dict, source) -> LoaderState:
    """Load `state` into a loader over `source`, as `Coordinator.restore` does."""
    loader, made_by = identity(source)
    return LoaderState.from_dict(
        state,
        expect_loader=loader,
        expect_made_by=made_by,
        expect_num_samples=source.layout().num_samples,
    )


def dataset(folder, names, rows=10) -> str:
    """`folder` holding one Parquet file of `rows` rows per name (`rows` may be a list)."""
    rows = rows if isinstance(rows, list) else [rows] * len(names)
    for name, count in zip(names, rows):
        written = write_dataset(folder / "tmp", [count])[0]
        os.replace(written, folder / name)
    (folder / "tmp").rmdir()
    return str(folder)


@pytest.mark.parametrize(
    ("other", "rows"),
    [
        (["a", "x", "y"], None),  # other files after the first
        (["a", "c", "b"], None),  # the same files in another order
        (["a", "b", "c"], [10, 5, 15]),  # rows moved between files, rewritten in place
    ],
)
def test_a_state_of_other_files_with_as_many_rows_is_refused(tmp_path, other, rows):
    """The same first file, file count and row count used to give the same id: the state
    loaded, and its row numbers named other rows."""
    folder = dataset(tmp_path, [f"{n}.parquet" for n in "abcxy"])
    saved = ParquetSource([f"{folder}/{n}.parquet" for n in "abc"])
    state = saved_state(saved)
    if rows is not None:
        dataset(tmp_path, [f"{n}.parquet" for n in other], rows)
    source = ParquetSource([f"{folder}/{n}.parquet" for n in other])
    assert source.layout().num_samples == saved.layout().num_samples
    with pytest.raises(ConfigError, match="belongs to loader") as refused:
        restore(state, source)
    assert "source: 'ParquetSource(a.parquet and 2 more; 30 rows; files " in str(refused.value)


def test_other_files_get_other_ids_in_every_file_source_and_in_a_mix(tmp_path):
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    folder = dataset(tmp_path, ["a.parquet", "b.parquet", "x.parquet"])
    for name in "abx":
        table = pq.read_table(f"{folder}/{name}.parquet")
        feather.write_feather(table, f"{folder}/{name}.arrow")
    arrow = [ArrowFileSource([f"{folder}/a.arrow", f"{folder}/{n}.arrow"]) for n in "bx"]
    assert identity(arrow[0])[0] != identity(arrow[1])[0]
    parquet = [ParquetSource([f"{folder}/a.parquet", f"{folder}/{n}.parquet"]) for n in "bx"]
    mixes = [MixedSource([p, arrow[0]], [1, 1]) for p in parquet]
    assert identity(mixes[0])[0] != identity(mixes[1])[0]


def test_the_same_files_moved_resume_and_an_empty_file_changes_nothing(tmp_path, monkeypatch):
    """Not where the dataset lives: a folder moved or mounted elsewhere (here: copied),
    named by a relative path or by a glob, keeps its id; so does an added empty file (it
    holds no row to map). Hive folders are part of the names (their values are columns)."""
    first = dataset(tmp_path / "first" / "year=2024", ["a.parquet", "b.parquet"])
    state = saved_state(ParquetSource(os.path.dirname(first)))
    moved = tmp_path / "mnt" / "elsewhere"
    shutil.copytree(os.path.dirname(first), moved)
    write_dataset(moved / "year=2024", [0], prefix="c-empty")
    monkeypatch.chdir(tmp_path)
    for paths in ("mnt/elsewhere", f"{moved}/*/*.parquet", f"{moved}/**"):
        with pytest.warns(UserWarning, match="holds no rows"):
            source = ParquetSource(paths)
        assert restore(state, source).consumed == ((0, 10),)
    other_year = tmp_path / "other" / "year=2025"
    shutil.copytree(first, other_year)
    with pytest.raises(ConfigError, match="belongs to loader"):
        restore(state, ParquetSource(str(other_year.parent)))


def test_a_state_saved_by_an_older_id_resumes_over_its_files_with_a_warning(tmp_path, caplog):
    """An older rayshard described a file source by its first file as named (its folder
    too), the file count and rows: such a state loads as this loader's when all it
    recorded agrees, with a warning that it could check no more; else it is refused."""
    folder = dataset(tmp_path / "data", ["a.parquet", "b.parquet", "c.parquet"])
    source = ParquetSource(folder)
    older = f"ParquetSource({folder}/a.parquet and 2 more; 30 rows)"
    state = saved_state(source, description=older)
    with caplog.at_level(logging.WARNING, logger="rayshard.core.state"):
        loaded = restore(state, source)
    assert loaded.loader == identity(source)[0] and loaded.consumed == ((0, 15),)
    assert "saved by an older rayshard" in caplog.text and "files it was saved over" in caplog.text
    assert json.loads(loaded.made_by) == identity(source)[1]  # now this loader's own
    for refused in (
        saved_state(source, description=older.replace("/a.parquet", "/z.parquet")),
        saved_state(source, description=older.replace("2 more", "3 more")),
        saved_state(source, description=older.replace("rows)", "rows; split_rows=5)")),
        saved_state(source, name="eval", description=older),
        {**state, "made_by": {**state["made_by"], "batch_size": 6}},
        {key: value for key, value in state.items() if key != "made_by"},
    ):
        with pytest.raises(ConfigError, match="belongs to loader"):
            restore(refused, source)


def test_show_data_warns_of_other_files_with_the_same_first_file_and_counts(tmp_path):
    """`rayshard state show --data`: a state saved over [a, b] shown against [a, x] of
    the same rows is warned of; the same files in another folder are not."""
    dataset(tmp_path / "data", ["a.parquet", "b.parquet"])
    saved = ParquetSource(f"{tmp_path}/data/*.parquet")
    path = tmp_path / "state.json"
    path.write_text(json.dumps(saved_state(saved)))
    moved = shutil.copytree(tmp_path / "data", tmp_path / "moved")
    os.rename(tmp_path / "data" / "b.parquet", tmp_path / "data" / "x.parquet")
    for data, warned in ((f"{tmp_path}/data/*.parquet", True), (str(moved), False)):
        result = CliRunner().invoke(main, ["state", "show", str(path), "--data", data])
        assert result.exit_code == 0, result.output
        assert ("warning:" in result.stderr) is warned, result.stderr
