"""A saved loader state on disk: read it (a `ConfigError` naming the file if it is not
one) and write it atomically. Shared by `rayshard.train` and `rayshard state`; no Ray.

Writes go to a temporary file in the target's folder, fsynced, then `os.replace`d over
the target: a crash leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from rayshard.errors import ConfigError

STATE_FILE = "rayshard_state.json"  # in a checkpoint folder
PROCESS_STATE_FILE = "rayshard_state_{rank}.json"  # one per process (a Hugging Face checkpoint)
NAMED_STATE_FILE = "rayshard_state.{name}.json"  # one of several loaders' in a checkpoint
WHAT_TO_PASS = "pass the JSON written by rayshard.train.save_state or iterator.state_dict()"


def read_state_json(path: str | os.PathLike, fix: str = WHAT_TO_PASS) -> dict:
    """The JSON object in state file `path`; unreadable or malformed JSON, or JSON that is
    not an object, is a `ConfigError` naming the file and ending with `fix`."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(
            f"{path} is not a rayshard loader state (not readable JSON: {error}): {fix}"
        ) from error
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} is not a rayshard loader state (a JSON {type(data).__name__}, not an "
            f"object): {fix}"
        )
    return data


def state_file_name(name: str | None = None) -> str:
    """The file a checkpoint holds a loader's state in: `rayshard_state.json`, or under
    `name` (several loaders in one checkpoint) `rayshard_state.NAME.json`."""
    if name is None:
        return STATE_FILE
    if not _allowed(name):
        raise ConfigError(
            f"state name {name!r}: use letters, digits, '-' and '_' (it names a file "
            f"{NAMED_STATE_FILE} in the checkpoint)"
        )
    return NAMED_STATE_FILE.format(name=name)


def state_name_of(file_name: str) -> str | None:
    """NAME of a named state's file `rayshard_state.NAME.json` (a name `state_file_name`
    takes), else None."""
    prefix, suffix = NAMED_STATE_FILE.split("{name}")
    if not (file_name.startswith(prefix) and file_name.endswith(suffix)):
        return None
    name = file_name[len(prefix) : -len(suffix)]
    return name if _allowed(name) else None


def _allowed(name: object) -> bool:
    """Letters, digits, '-' and '_', at least one (a state's name becomes a file name)."""
    return isinstance(name, str) and bool(name) and name.replace("-", "").replace("_", "").isalnum()


def atomic_write(target: str | os.PathLike, payload: bytes, mode: int | None = None) -> None:
    """Write a temp file beside `target`, fsync it, then rename it over `target`; with
    `target`'s permissions, else `mode`, else a new file's."""
    target = Path(target)
    handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        os.chmod(temp, mode_of(target) if mode is None else mode)
        with os.fdopen(handle, "wb") as stream:
            stream.write(payload)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp, target)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def mode_of(target: Path) -> int:
    """The permissions `target` has, or a new file's (mkstemp's 0o600 would hide it)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


__all__ = [
    "NAMED_STATE_FILE",
    "PROCESS_STATE_FILE",
    "STATE_FILE",
    "atomic_write",
    "mode_of",
    "read_state_json",
    "state_file_name",
    "state_name_of",
]
