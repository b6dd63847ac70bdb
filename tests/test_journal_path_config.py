"""`journal_path` is a local file the coordinator appends to and locks: a URI is refused
and `~` expanded when the configuration is made, and a relative path is made absolute on
the driver (the coordinator actor runs in Ray's working_dir, where it would name another
file); a folder given as the journal is said to be one. No Ray."""

from __future__ import annotations

import os
import pathlib

import pytest

from rayshard.config.loader_config import LoaderConfig
from rayshard.config.parts import RuntimeConfig
from rayshard.errors import ConfigError
from rayshard.runtime.journal import Journal


@pytest.mark.parametrize("uri", ["s3://bucket/journal.jsonl", "file:///tmp/j.jsonl"])
def test_a_uri_journal_path_is_refused(uri):
    with pytest.raises(ConfigError, match=r"is a URI: the journal must be a local or mounted"):
        RuntimeConfig(journal_path=uri)
    with pytest.raises(ConfigError, match=r"journal_path='s3://"):
        LoaderConfig.resolve({"journal_path": "s3://bucket/j.jsonl"})


def test_a_home_journal_path_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert RuntimeConfig(journal_path="~/runs/j.jsonl").journal_path == str(
        tmp_path / "runs" / "j.jsonl"
    )


def test_a_relative_journal_path_is_made_absolute_where_the_config_is_made(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    made_here = LoaderConfig(journal_path="runs/j.jsonl")
    monkeypatch.chdir("/")  # as in the coordinator actor, elsewhere
    assert made_here.journal_path == str(tmp_path / "runs" / "j.jsonl")
    assert RuntimeConfig(journal_path=pathlib.Path("j.jsonl")).journal_path == "/j.jsonl"


@pytest.mark.parametrize("bad", ["", "   ", 3])
def test_an_empty_or_non_string_journal_path_is_refused(bad):
    with pytest.raises(ConfigError, match=r"journal_path=.* must be a non-empty string"):
        RuntimeConfig(journal_path=bad)


def test_none_keeps_the_default_journal():
    assert RuntimeConfig().journal_path is None


def test_a_folder_as_journal_path_is_said_to_be_a_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"is a folder: the journal is a file") as info:
        Journal(str(tmp_path), "loader:0123").check_reusable()
    assert "corrupt" not in str(info.value)
    assert os.path.join(str(tmp_path), "journal.jsonl") in str(info.value)
