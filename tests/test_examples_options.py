"""Examples' command lines and clean-up: the elastic experiment's default schedule, the
text example's `--data` (read through the loader's source: globs too), and the Lightning
example's temporary root folder."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


@pytest.mark.parametrize(
    ("args", "default_added"),
    [
        ([], True),
        (["--out", "X"], True),
        (["--out", "X", "mine.yaml"], False),  # a schedule after the options
        (["mine.yaml", "--out", "X"], False),
        (["--help"], True),
    ],
)
def test_the_elastic_experiment_adds_its_schedule_only_when_none_is_given(args, default_added):
    from examples.elastic_experiment import DEFAULT_SCHEDULE, with_default_schedule

    expected = [DEFAULT_SCHEDULE, *args] if default_added else args
    assert with_default_schedule(args) == expected


def test_the_text_example_reads_a_glob_for_its_tokenizer(tmp_path):
    from examples.train_text import source_texts
    from rayshard.sources.parquet import ParquetSource

    for index in range(2):
        table = pa.table({"id": [2 * index, 2 * index + 1], "text": [f"a{index}", f"b{index}"]})
        pq.write_table(table, tmp_path / f"part-{index}.parquet")
    source = ParquetSource(str(tmp_path / "part-*.parquet"), columns=["id", "text"])
    assert source_texts(source) == ["a0", "b0", "a1", "b1"]


def test_the_text_example_says_data_needs_an_id_column(capsys):
    from examples.train_text import main

    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "`id` column" in help_text and "glob" in help_text


def test_the_lightning_example_removes_its_root_folder(monkeypatch):
    import examples.train_lightning as example

    roots = []

    class Trainer:
        def __init__(self, **options):
            roots.append(options["default_root_dir"])
            assert os.path.isdir(roots[-1])

        def fit(self, *args, **kwargs):
            pass

    for name in ("LightningBatches", "RayshardCheckpoint", "RayDDPStrategy"):
        monkeypatch.setattr(example, name, lambda *a, **k: None)
    monkeypatch.setattr(example, "RayLightningEnvironment", lambda: None)
    monkeypatch.setattr(example.rayshard.train, "iterator", lambda loader: None)
    monkeypatch.setattr(example.pl, "Trainer", Trainer)
    monkeypatch.setattr(example, "prepare_trainer", lambda trainer: trainer)
    monkeypatch.setattr(example.ray.train, "get_checkpoint", lambda: None)
    for _ in range(2):
        example.fit({"loader": None, "epochs": 1}, model=None, report=False)
    assert len(roots) == 2 and not any(os.path.exists(root) for root in roots)
