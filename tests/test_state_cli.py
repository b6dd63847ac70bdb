"""`rayshard state`: show, rewrite safely, refuse what is not this loader's state (exit 1),
click-style usage errors (exit 2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rayshard.cli import main
from rayshard.cli.state_cmd import STATE_FILE
from rayshard.core.state import LoaderState

LOADER = "train:3f2a"
STATE = {
    "version": 1,
    "loader": LOADER,
    "epoch": 2,
    "seed": 7,
    "consumed": [[0, 10], [40, 55]],
    "world_size": 4,
    "num_samples": 100,
}


def invoke(*args: str):
    return CliRunner().invoke(main, ["state", *args])


def write(path, data) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def read(path) -> LoaderState:
    return LoaderState.from_dict(Path(path).read_text(), expect_loader=LOADER)


def show(path, *args: str) -> dict:
    result = invoke("show", str(path), "--format", "json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.fixture
def state_file(tmp_path) -> str:
    return write(tmp_path / "state.json", STATE)


def test_show_table(state_file):
    result = invoke("show", state_file)
    assert result.exit_code == 0, result.output
    for text in (LOADER, "epoch       2", "25 of 100 (25.0%)", "remaining   75", "[0,10) [40,55)"):
        assert text in result.output
    assert "world size  4" in result.output


def test_show_skip_epoch_show_round_trip(state_file):
    before = show(state_file)
    assert (before["epoch"], before["consumed"], before["remaining"]) == (2, 25, 75)
    assert before["consumed_intervals"] == [[0, 10], [40, 55]]
    assert before["world_size"] == 4 and before["consumed_fraction"] == 0.25

    result = invoke("skip-epoch", state_file)
    assert result.exit_code == 0, result.output
    assert "epoch 2 -> 3" in result.output

    after = show(state_file)
    assert (after["epoch"], after["consumed"], after["remaining"]) == (3, 0, 100)
    assert after["consumed_intervals"] == []
    assert {k: after[k] for k in ("loader", "seed", "world_size", "num_samples")} == {
        k: before[k] for k in ("loader", "seed", "world_size", "num_samples")
    }


def test_retarget_writes_a_strict_state(state_file, tmp_path):
    out = tmp_path / "out.json"
    result = invoke("retarget", state_file, "--world-size", "8", "-o", str(out))
    assert result.exit_code == 0, result.output
    state = read(out)
    assert state.world_size == 8
    assert (state.epoch, state.consumed, state.num_samples) == (2, ((0, 10), (40, 55)), 100)
    assert json.loads(Path(state_file).read_text()) == STATE  # -o leaves the original alone
    assert not os.path.exists(state_file + ".bak")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_set_epoch(state_file):
    result = invoke("set-epoch", state_file, "--epoch", "0")
    assert result.exit_code == 0, result.output
    state = read(state_file)
    assert (state.epoch, state.consumed) == (0, ())


def test_in_place_rewrite_keeps_a_backup(state_file):
    original = Path(state_file).read_text()
    os.chmod(state_file, 0o640)
    result = invoke("retarget", state_file, "--world-size", "2")
    assert result.exit_code == 0, result.output
    assert Path(state_file + ".bak").read_text() == original
    assert read(state_file).world_size == 2
    assert os.stat(state_file).st_mode & 0o777 == 0o640  # the rename kept its permissions


def test_checkpoint_folder_is_accepted(tmp_path):
    checkpoint = tmp_path / "checkpoint_000003"
    checkpoint.mkdir()
    write(checkpoint / STATE_FILE, STATE)
    assert show(checkpoint)["epoch"] == 2
    result = invoke("skip-epoch", str(checkpoint))
    assert result.exit_code == 0, result.output
    assert read(checkpoint / STATE_FILE).epoch == 3
    assert (checkpoint / (STATE_FILE + ".bak")).exists()

    out = tmp_path / "elsewhere"
    out.mkdir()
    assert invoke("retarget", str(checkpoint), "--world-size", "3", "-o", str(out)).exit_code == 0
    assert read(out / STATE_FILE).world_size == 3
    # as the README writes it: a new folder, with parents made
    for name in ("new/", "made/with/parents"):
        result = invoke(
            "retarget", str(checkpoint), "--world-size", "5", "-o", str(tmp_path / name)
        )
        assert result.exit_code == 0, result.output
        assert read(tmp_path / name / STATE_FILE).world_size == 5


def test_a_trainer_checkpoint_with_a_state_per_process_is_rewritten_whole(tmp_path):
    """A Hugging Face Trainer checkpoint holds `rayshard_state_<process>.json`: a rewrite
    changes every process's file (one changed alone, the processes would resume from
    different states)."""
    checkpoint = tmp_path / "checkpoint-500"
    checkpoint.mkdir()
    for process in (0, 1, 10):
        write(checkpoint / f"rayshard_state_{process}.json", {**STATE, "epoch": 2 + process})
    assert show(checkpoint)["epoch"] == 2  # process 0's
    assert invoke("skip-epoch", str(checkpoint)).exit_code == 0
    assert [read(checkpoint / f"rayshard_state_{p}.json").epoch for p in (0, 1, 10)] == [3, 4, 13]
    out = tmp_path / "moved"
    assert invoke("retarget", str(checkpoint), "--world-size", "2", "-o", str(out)).exit_code == 0
    assert [read(out / f"rayshard_state_{p}.json").world_size for p in (0, 1, 10)] == [2] * 3
    refused = invoke(
        "retarget", str(checkpoint), "--world-size", "2", "-o", str(tmp_path / "a.json")
    )
    assert refused.exit_code == 1 and "one state file per process; pass a folder" in refused.output


def test_folder_without_a_state_is_refused(tmp_path):
    result = invoke("show", str(tmp_path))
    assert result.exit_code == 1
    assert f"{tmp_path} is a folder without {STATE_FILE} or rayshard_state_<process>" in (
        result.output
    )


def test_refuses_a_foreign_loader(state_file):
    result = invoke("skip-epoch", state_file, "--expect-loader", "eval:9")
    assert result.exit_code == 1
    assert state_file in result.output
    assert "belongs to loader 'train:3f2a', not to 'eval:9'" in result.output
    assert "drop --expect-loader" in result.output
    assert json.loads(Path(state_file).read_text()) == STATE  # nothing written
    assert invoke("show", state_file, "--expect-loader", LOADER).exit_code == 0


def test_refuses_another_version(tmp_path):
    path = write(tmp_path / "s.json", {**STATE, "version": 2})
    result = invoke("retarget", path, "--world-size", "2")
    assert result.exit_code == 1
    assert f"{path} holds loader state version 2" in result.output
    assert "reads version 1" in result.output
    assert not os.path.exists(path + ".bak")
    path = write(tmp_path / "t.json", {**STATE, "version": "1"})
    result = invoke("show", path)
    assert result.exit_code == 1 and "version='1' must be the integer 1" in result.output


def test_an_out_path_under_a_file_says_what_to_give(state_file, tmp_path):
    (tmp_path / "existing.txt").write_text("x")
    result = invoke("skip-epoch", state_file, "-o", str(tmp_path / "existing.txt"))
    assert result.exit_code == 1
    assert "existing.txt is a file: give -o a .json file name or a folder" in result.output


@pytest.mark.parametrize("text", ["not json {", "", "\x00\x01"])
def test_refuses_non_json(tmp_path, text):
    path = write(tmp_path / "s.json", text)
    result = invoke("show", path)
    assert result.exit_code == 1
    assert f"{path} is not a rayshard loader state (not readable JSON" in result.output


@pytest.mark.parametrize("data", [[1, 2], "a string", 3])
def test_refuses_json_that_is_not_an_object(tmp_path, data):
    path = write(tmp_path / "s.json", json.dumps(data))
    result = invoke("show", path)
    assert result.exit_code == 1
    assert f"{path} is not a rayshard loader state (a JSON" in result.output


def test_refuses_unknown_and_missing_keys(tmp_path):
    extra = write(tmp_path / "extra.json", {**STATE, "cursor": 3})
    result = invoke("show", extra)
    assert result.exit_code == 1
    assert "unknown keys ['cursor']" in result.output and extra in result.output

    torchdata_like = write(tmp_path / "other.json", {"_snapshot": {}, "_steps_since": 4})
    result = invoke("skip-epoch", torchdata_like)
    assert result.exit_code == 1
    assert "not a rayshard loader state: missing keys" in result.output
    assert "rayshard.train.save_state" in result.output


def test_refuses_consumed_outside_the_dataset(tmp_path):
    path = write(tmp_path / "s.json", {**STATE, "consumed": [[90, 120]]})
    result = invoke("show", path)
    assert result.exit_code == 1
    assert "consumed interval [90, 120] is not within [0, num_samples=100]" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retarget", "{p}", "--world-size", "0"], "'--world-size': 0 is not in the range x>=1"),
        (["retarget", "{p}"], "Missing option '--world-size'"),
        (["set-epoch", "{p}", "--epoch", "-1"], "'--epoch': -1 is not in the range x>=0"),
        (["show", "{p}", "--format", "xml"], "'--format': 'xml' is not one of"),
        (["show", "{p}/missing.json"], "does not exist"),
        (["frobnicate", "{p}"], "No such command 'frobnicate'"),
    ],
)
def test_bad_flags_are_usage_errors(state_file, args, message):
    result = invoke(*[a.format(p=state_file) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def write_parquet(path, row_groups: list[int]) -> str:
    """One Parquet file with row groups of the given sizes, ids 0..n-1."""
    n = sum(row_groups)
    table = pa.table({"id": pa.array(range(n), type=pa.int64())})
    with pq.ParquetWriter(path, table.schema) as writer:
        at = 0
        for size in row_groups:
            writer.write_table(table.slice(at, size))
            at += size
    return str(path)


def test_per_split_progress_from_parquet_row_groups(tmp_path):
    from rayshard.sources.parquet import ParquetSource

    data = write_parquet(tmp_path / "train.parquet", [30, 30, 20, 20])
    assert pq.ParquetFile(data).metadata.num_row_groups == 4
    path = write(tmp_path / "s.json", {**STATE, "consumed": [[0, 30], [40, 50], [80, 81]]})

    doc = show(path, "--data", data)
    splits = doc["splits"]
    assert [(s["start"], s["end"]) for s in splits] == ParquetSource(data).splits()
    assert [(s["consumed"], s["total"], s["status"]) for s in splits] == [
        (30, 30, "done"),
        (10, 30, "partial"),
        (0, 20, "untouched"),
        (1, 20, "partial"),
    ]
    assert [s["label"] for s in splits] == [f"train.parquet#{g}" for g in range(4)]

    table = invoke("show", path, "--data", data)
    assert table.exit_code == 0, table.output
    assert "4: 1 done, 2 partial, 1 untouched" in table.output
    assert "train.parquet#1  [30,60)   10/30     partial" in table.output


def test_runs_of_done_splits_fold_into_one_row(tmp_path):
    data = write_parquet(tmp_path / "d.parquet", [25, 25, 25, 25])
    path = write(tmp_path / "s.json", {**STATE, "consumed": [[0, 75]]})
    table = invoke("show", path, "--data", data)
    assert table.exit_code == 0, table.output
    assert "d.parquet#0 .. d.parquet#2  [0,75)    75/75     done" in table.output


def test_data_of_another_size_is_refused(tmp_path, state_file):
    data = write_parquet(tmp_path / "small.parquet", [10, 10])
    result = invoke("show", state_file, "--data", data)
    assert result.exit_code == 1
    assert "the data has 20 samples but the state was saved for 100" in result.output


def test_state_file_name_matches_ray_train_glue():
    from rayshard.train import STATE_FILE as TRAIN_STATE_FILE

    assert TRAIN_STATE_FILE == STATE_FILE


def test_an_in_place_rewrite_through_a_link_rewrites_the_file_and_keeps_its_mode(tmp_path):
    """The file a link names is rewritten (the link stays a link) and its `.bak` keeps the
    file's permissions; `-o` naming the file itself is in place too (a `.bak` kept)."""
    (tmp_path / "real").mkdir()
    real = write(tmp_path / "real" / "s.json", STATE)
    os.chmod(real, 0o600)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    result = invoke("skip-epoch", str(link))
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and read(real).epoch == 3
    assert os.stat(real + ".bak").st_mode & 0o777 == 0o600
    assert json.loads(Path(real + ".bak").read_text()) == STATE
    result = invoke("skip-epoch", real, "-o", real)
    assert result.exit_code == 0, result.output
    assert read(real).epoch == 4 and read(real + ".bak").epoch == 3
    result = invoke("skip-epoch", real, "-o", "")
    assert result.exit_code == 2 and "empty path" in result.output, result.output


def test_show_data_takes_a_glob_and_names_partitioned_files_by_their_folders(tmp_path):
    for year in (2023, 2024):
        (tmp_path / f"year={year}").mkdir()
        write_parquet(tmp_path / f"year={year}" / "part-0.parquet", [50])
    path = write(tmp_path / "s.json", {**STATE, "consumed": [[0, 50]]})
    doc = show(path, "--data", str(tmp_path / "year=*" / "*.parquet"))
    labels = [s["label"] for s in doc["splits"]]
    assert labels == ["year=2023/part-0.parquet#0", "year=2024/part-0.parquet#0"]
    assert [s["status"] for s in doc["splits"]] == ["done", "untouched"]


def test_a_named_state_is_picked_with_name_and_keeps_its_name_when_moved(tmp_path):
    """A checkpoint of several loaders holds `rayshard_state.NAME.json` (save_state's
    `name=`): `--name` picks one; a folder of named states alone says which it holds."""
    checkpoint = tmp_path / "checkpoint_000001"
    checkpoint.mkdir()
    write(checkpoint / "rayshard_state.val.json", {**STATE, "epoch": 5})
    write(checkpoint / "rayshard_state.train-2.json", STATE)
    asked = invoke("show", str(checkpoint))
    assert asked.exit_code == 1
    assert "holds the named states train-2, val: pick one with --name" in asked.output
    assert show(checkpoint, "--name", "val")["epoch"] == 5
    assert show(checkpoint, "--name", "train-2")["epoch"] == 2
    assert invoke("skip-epoch", str(checkpoint), "--name", "val").exit_code == 0
    assert read(checkpoint / "rayshard_state.val.json").epoch == 6
    assert read(checkpoint / "rayshard_state.train-2.json").epoch == 2  # the other untouched
    out = tmp_path / "moved"
    result = invoke(
        "retarget", str(checkpoint), "--name", "val", "--world-size", "2", "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    assert read(out / "rayshard_state.val.json").world_size == 2  # restorable by its name
    assert not (out / STATE_FILE).exists()
    missing = invoke("show", str(checkpoint), "--name", "test")
    assert missing.exit_code == 1 and "without rayshard_state.test.json" in missing.output
    assert invoke("show", str(checkpoint), "--name", "a/b").exit_code == 2
    odd = write(tmp_path / "rayshard_state_backup.json", STATE)  # not a name rayshard gives
    assert invoke("skip-epoch", odd, "-o", str(tmp_path / "odd")).exit_code == 0
    assert read(tmp_path / "odd" / STATE_FILE).epoch == 3
    on_file = invoke("show", str(checkpoint / "rayshard_state.val.json"), "--name", "val")
    assert on_file.exit_code == 2 and "is a file" in on_file.output


def test_data_other_than_the_states_source_is_named_in_a_warning(tmp_path, monkeypatch):
    """`show --data` of other files with the same row count would show another dataset's
    progress: the state's `made_by` names its source, so the difference is warned of (the
    same files reached from another folder are not)."""
    from rayshard.sources.parquet import ParquetSource

    trained = write_parquet(tmp_path / "train.parquet", [50, 50])
    made_by = {"source": ParquetSource(trained).describe(), "num_samples": 100}
    path = write(tmp_path / "s.json", {**STATE, "made_by": made_by})
    other = write_parquet(tmp_path / "eval.parquet", [50, 50])
    split = {**made_by, "source": made_by["source"][:-1] + "; split_rows=10)"}
    write(tmp_path / "split.json", {**STATE, "made_by": split})  # (the data cannot say)
    quiet = invoke("show", str(tmp_path / "split.json"), "--data", trained)
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr, quiet.stderr
    for data, warned in ((trained, False), (other, True), ("train.parquet", False)):
        monkeypatch.chdir(tmp_path)  # (the last: the same file, relative)
        result = invoke("show", path, "--data", data, "--format", "json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["consumed"] == 25
        assert ("warning:" in result.stderr) is warned, result.stderr
        if warned:
            assert "train.parquet" in result.stderr and "eval.parquet" in result.stderr
