"""The loader benchmark's dataset folder (`--data`): it rewrites only what it wrote, and
refuses a folder holding Parquet files it did not write rather than deleting them."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.loaders.data import make_dataset, parquet_files


def _foreign(folder, name="mine.parquet"):
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"a": [1, 2]}), folder / name)
    return folder / name


def test_a_folder_with_someone_elses_parquet_is_refused_and_kept(tmp_path):
    mine = _foreign(tmp_path)
    with pytest.raises(FileExistsError, match="did not write.*mine.parquet"):
        make_dataset(tmp_path, 1_000, files=2, row_group_size=500)
    assert mine.exists() and parquet_files(tmp_path) == [str(mine)]


def test_a_rewrite_deletes_only_the_files_the_benchmark_wrote(tmp_path):
    make_dataset(tmp_path, 1_000, files=4, row_group_size=500)
    notes = tmp_path / "notes.txt"
    notes.write_text("kept")
    make_dataset(tmp_path, 2_000, files=2, row_group_size=500)  # another size: rewritten
    files = parquet_files(tmp_path)
    assert [p.rsplit("/", 1)[1] for p in files] == ["part-000.parquet", "part-001.parquet"]
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in files) == 2_000
    assert notes.read_text() == "kept"
    assert make_dataset(tmp_path, 2_000, files=2, row_group_size=500) == tmp_path  # reused


def test_a_write_cut_off_is_the_benchmarks_own_to_redo(tmp_path):
    make_dataset(tmp_path, 1_000, files=2, row_group_size=500)
    (tmp_path / "_DONE").rename(tmp_path / "_WRITING")  # as if cut off before the end
    make_dataset(tmp_path, 1_000, files=2, row_group_size=500)
    assert len(parquet_files(tmp_path)) == 2 and not (tmp_path / "_WRITING").exists()


def test_the_loader_bench_refuses_such_a_data_folder_with_a_clear_error(tmp_path, capsys):
    from benchmarks.loader_bench import main

    mine = _foreign(tmp_path)
    assert main([f"--data={tmp_path}", "--loaders=raw", f"--json={tmp_path / 'o.json'}"]) == 2
    err = capsys.readouterr().err
    assert "did not write" in err and "--data" in err
    assert mine.exists()
