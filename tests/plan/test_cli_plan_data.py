"""`rayshard plan --data PATH --policy P`: the plan of real Parquet files (written by two
writers) is what a loader over them reads, rank for rank, epoch for epoch; usage errors
name the flag or the path."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.plan.test_cli_plan import invoke, plan_json
from tests.runtime.helpers import run_lockstep, unique_name

SIZES = (30, 50, 20)  # rows of the files a-, b-, c-, in dataset order


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """Three files with a global `id`: pyarrow wrote the first and last, polars the middle."""
    folder = tmp_path_factory.mktemp("plan-data")
    start = 0
    for index, rows in enumerate(SIZES):
        ids = np.arange(start, start + rows, dtype=np.int64)
        path = os.path.join(folder, f"{'abc'[index]}-part.parquet")
        if index == 1:
            pl.DataFrame({"id": ids}).write_parquet(path, row_group_size=16)
        else:
            pq.write_table(pa.table({"id": ids}), path, row_group_size=10)
        start += rows
    return str(folder)


@pytest.mark.parametrize(
    ("policy", "world", "effective"),
    [("data", 2, "data"), ("file", 2, "file"), ("file_or_data", 4, "data")],
)
def test_the_plan_of_real_files_is_what_the_loader_reads(
    ray_session, dataset, policy, world, effective
):
    doc = plan_json(
        *("--data", dataset, "--policy", policy, "--world-size", str(world)),
        *("--batch-size", "8", "--epochs", "2", "--pad-last-batch"),
    )
    assert doc["policy"] == effective
    assert [f["rows"] for f in doc["files"]] == list(SIZES)
    names = [os.path.basename(f["path"]) for f in doc["files"]]
    assert names == ["a-part.parquet", "b-part.parquet", "c-part.parquet"]
    by_files = effective == "file"
    loader = Loader(
        ParquetSource(dataset),
        batch_size=8,
        policy=policy,
        pad_last_batch=True,
        name=unique_name("plan"),
    )
    iterators = [
        loader.iterator(world_rank=r, world_size=world, batch_format="numpy") for r in range(world)
    ]
    for epoch in doc["epochs"]:
        received = run_lockstep(iterators)
        for rank in epoch["ranks"]:
            batches = received[rank["rank"]]
            ranges = rank["sample_ranges"] if by_files else rank["ranges"]
            real = [int(i) for b in batches for i in b["id"][~b["_padded"]]]
            assert real == [i for start, end in ranges for i in range(start, end)], epoch
            assert sum(int(b["_padded"].sum()) for b in batches) == rank["padded"]
            assert len(batches) == rank["batches"]
    loader.shutdown()


def test_the_table_names_the_policy_and_every_file_with_its_rows(dataset):
    result = invoke("--data", dataset, "--policy", "file", "--world-size", "2")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("100 samples in 3 files, policy=file,")
    names = ("a-part.parquet", "b-part.parquet", "c-part.parquet")
    assert lines[-3:] == [
        f"file {i}: {os.path.join(dataset, name)} ({rows} rows)"
        for i, (name, rows) in enumerate(zip(names, SIZES))
    ]


def test_data_usage_errors_name_the_flag_or_the_path(dataset, tmp_path):
    missing = str(tmp_path / "nowhere")
    cases = [
        (("--data", missing, "--world-size", "2"), missing),
        (("--data", dataset, "--samples", "4", "--world-size", "2"), "'--data'"),
        (("--samples", "4", "--policy", "file", "--world-size", "2"), "--policy applies to --data"),
        (("--data", dataset, "--policy", "dynamic", "--world-size", "2"), "'dynamic'"),
        (("--data", dataset, "--policy", "file", "--world-size", "4"), "3 files cannot be split"),
    ]
    for args, named in cases:
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert named in result.output, (args, result.output)


def test_json_of_data_lists_files_in_dataset_order(dataset):
    doc = json.loads(invoke("--data", dataset, "--world-size", "3", "--format", "json").output)
    assert doc["num_samples"] == sum(SIZES) and doc["num_files"] == len(SIZES)
    assert doc["policy"] == "data" and len(doc["epochs"]) == 1


def test_the_readmes_data_example_is_the_output(dataset, tmp_path, monkeypatch):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    command = "$ rayshard plan --data data/ --policy file --world-size 2\n"
    block = readme[readme.index(command) + len(command) :]
    shown = block[: block.index("```")].rstrip("\n")
    shutil.copytree(dataset, tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    result = invoke(*command.split()[3:])
    assert result.exit_code == 0, result.output
    assert result.output.rstrip("\n") == shown


def test_shuffle_blocks_plans_the_row_groups_each_rank_reads_under_the_global_shuffle(dataset):
    """Each rank's samples under `shuffle_blocks` change with the epoch: the plan shown is
    the coordinator's own (`epoch_plan`), not the plain shuffle's contiguous shares."""
    from rayshard.config.loader_config import LoaderConfig
    from rayshard.core.planning import epoch_plan

    doc = plan_json(
        *("--data", dataset, "--world-size", "2", "--batch-size", "4"),
        *("--shuffle-blocks", "8", "--epochs", "3", "--seed", "5"),
    )
    config = LoaderConfig(policy="data", batch_size=4, shuffle_blocks=8, seed=5)
    for epoch in doc["epochs"]:
        served = epoch_plan(config, ParquetSource(dataset), 2, epoch["epoch"])
        assert [[list(r) for r in rank.ranges] for rank in served.ranks] == [
            rank["ranges"] for rank in epoch["ranks"]
        ]
    assert doc["epochs"][0]["ranks"][0]["ranges"] != [[0, 50]]  # not the plain shares
    assert doc["shuffled"] and doc["shuffle_blocks"] == 8


def test_flags_the_data_plan_does_not_use_are_usage_errors(dataset):
    cases = [
        (("--rows-per-file", "5"), "--rows-per-file applies to file mode"),
        (("--uneven", "replicate"), "--uneven applies to file mode"),
        (("--shuffle-blocks", "4", "--policy", "file"), "--shuffle-blocks applies to --data"),
    ]
    for extra, named in cases:
        result = invoke("--data", dataset, "--world-size", "2", *extra)
        assert result.exit_code == 2, (extra, result.output)
        assert named in result.output, (extra, result.output)
    result = invoke("--samples", "10", "--world-size", "2", "--shuffle-blocks", "4")
    assert result.exit_code == 2 and "--shuffle-blocks applies to --data" in result.output
    # --uneven with the file policy is the file plan's option
    result = invoke(
        "--data", dataset, "--world-size", "2", "--policy", "file", "--uneven", "replicate"
    )
    assert result.exit_code == 0, result.output
