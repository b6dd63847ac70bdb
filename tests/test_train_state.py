"""`rayshard.train.save_state` / `restore` on disk, without Ray: the write is atomic, and a
damaged state file is a `ConfigError` naming it."""

from __future__ import annotations

import contextlib
import json
import os

import pytest

import rayshard.train
from rayshard.errors import ConfigError
from rayshard.train import STATE_FILE

STATE = {"version": 1, "loader": "train:3f2a", "epoch": 2, "seed": 7, "consumed": [[0, 10]]}


class Batches:
    """What `save_state` and `restore` use of a `ShardIterator`."""

    def __init__(self, state=None):
        self.state = state
        self.loaded = None

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.loaded = state


class Checkpoint:
    def __init__(self, directory):
        self.path = str(directory)

    @contextlib.contextmanager
    def as_directory(self):
        yield self.path


def test_save_state_round_trips_and_leaves_no_temp_file(tmp_path):
    assert rayshard.train.save_state(Batches(STATE), tmp_path) == STATE
    assert os.listdir(tmp_path) == [STATE_FILE]
    batches = Batches()
    assert rayshard.train.restore(batches, Checkpoint(tmp_path)) is True
    assert batches.loaded == STATE


def test_a_failed_save_keeps_the_old_state_file(tmp_path):
    rayshard.train.save_state(Batches(STATE), tmp_path)
    # fails part-way through serializing: a write in place would leave half a file
    broken = {**STATE, "z": object()}
    with pytest.raises(TypeError):
        rayshard.train.save_state(Batches(broken), tmp_path)
    assert json.loads((tmp_path / STATE_FILE).read_text()) == STATE
    assert os.listdir(tmp_path) == [STATE_FILE]


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ('{"version": 1, "loader": "train:3f', "not readable JSON"),
        ("", "not readable JSON"),
        (b"\xff\xfe\x00garbage", "not readable JSON"),
        ("[1, 2]", "a JSON list, not an object"),
    ],
)
def test_restore_refuses_a_damaged_state_file_naming_it(tmp_path, text, what):
    path = tmp_path / STATE_FILE
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    batches = Batches()
    with pytest.raises(ConfigError, match=what) as info:
        rayshard.train.restore(batches, Checkpoint(tmp_path))
    assert str(path) in str(info.value)
    assert "resume from an earlier checkpoint, or delete this file" in str(info.value)
    assert batches.loaded is None


def test_restore_without_a_state_file_starts_fresh(tmp_path):
    assert rayshard.train.restore(Batches(), Checkpoint(tmp_path)) is False


class NamedBatches(Batches):
    def __init__(self, loader_id, state=None):
        super().__init__(state)
        self.loader_id = loader_id


def test_several_loaders_keep_their_states_in_one_checkpoint_under_their_names(tmp_path):
    val = {**STATE, "loader": "val:77aa"}
    rayshard.train.save_state(NamedBatches("train:3f2a", STATE), tmp_path)
    rayshard.train.save_state(NamedBatches("val:77aa", val), tmp_path, name="val")
    assert sorted(os.listdir(tmp_path)) == [STATE_FILE, "rayshard_state.val.json"]
    train_it, val_it = NamedBatches("train:3f2a"), NamedBatches("val:77aa")
    assert rayshard.train.restore(train_it, Checkpoint(tmp_path)) is True
    assert rayshard.train.restore(val_it, Checkpoint(tmp_path), name="val") is True
    assert (train_it.loaded, val_it.loaded) == (STATE, val)


def test_a_state_of_another_loader_is_left_not_loaded(tmp_path, caplog):
    """A validation loader restored from a checkpoint holding only the training loader's
    state: left, with a warning (loading it raised: another loader's state)."""
    rayshard.train.save_state(Batches(STATE), tmp_path)
    val_it = NamedBatches("val:77aa")
    assert rayshard.train.restore(val_it, Checkpoint(tmp_path)) is False
    assert val_it.loaded is None
    assert "holds the state of loader 'train:3f2a', not of 'val:77aa'" in caplog.text
    changed = NamedBatches("train:0000")  # the same name: its load says what changed
    assert rayshard.train.restore(changed, Checkpoint(tmp_path)) is True


@pytest.mark.parametrize("name", ["", "a/b", "..", 3])
def test_a_state_name_that_is_no_file_name_is_refused(tmp_path, name):
    with pytest.raises(ConfigError, match="state name"):
        rayshard.train.save_state(Batches(STATE), tmp_path, name=name)
