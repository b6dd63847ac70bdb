"""A store that cannot be reached while the paths are resolved is a `ConfigError` naming
the path, for a glob and a folder's listing as for a single file (no Ray, no server: a
filesystem whose lookups fail as an unreachable S3 endpoint's do)."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from rayshard.errors import ConfigError
from rayshard.sources._paths import resolve_paths


class _Unreachable(pafs.FileSystemHandler):
    """Every lookup fails with an `OSError`; `folders` are found, their listing fails."""

    def __init__(self, folders: tuple[str, ...] = ()) -> None:
        self.folders = folders

    def get_file_info(self, paths):
        if all(p in self.folders for p in paths):
            return [pafs.FileInfo(p, pafs.FileType.Directory) for p in paths]
        raise OSError("AWS Error NETWORK_CONNECTION: Could not connect to server")

    def get_file_info_selector(self, selector):
        raise OSError("AWS Error NETWORK_CONNECTION: Could not connect to server")

    def get_type_name(self):
        return "unreachable"

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def normalize_path(self, path):
        return path

    def _refuse(self, *args, **kwargs):
        raise NotImplementedError

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = _refuse
    delete_file = move = copy_file = open_input_stream = open_input_file = _refuse
    open_output_stream = open_append_stream = _refuse


@pytest.mark.parametrize(
    "path, folders",
    [
        ("bucket/data/*.parquet", ()),  # the glob's folder cannot be looked up
        ("bucket/data/*.parquet", ("bucket/data",)),  # its listing fails
        ("bucket/data", ("bucket/data",)),  # a folder's listing fails
        ("bucket/data/a.parquet", ()),  # one file (the check that was already there)
    ],
)
def test_an_unreachable_store_is_a_config_error_naming_the_path(path, folders):
    fs = pafs.PyFileSystem(_Unreachable(folders))
    with pytest.raises(ConfigError, match=r"cannot be looked up .*Could not connect") as info:
        resolve_paths(path, fs, kind="parquet")
    assert str(info.value).startswith(f"{path}: ")
    assert "credentials" in str(info.value)
