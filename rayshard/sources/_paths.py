"""Finding the files of a file source: a file, a folder, a glob or a list of them, on the
local disk or any filesystem `pyarrow.fs` opens."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from rayshard.errors import ConfigError

_GLOB_CHARS = re.compile(r"[*?\[]")


def resolve_paths(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    filesystem: pafs.FileSystem | None,
    *,
    kind: str,
) -> list[tuple[pafs.FileSystem, str, str, str, str]]:
    """(filesystem, path, display name, path relative to the folder or the glob's fixed
    part, version: "size:mtime" as the store reports them now) of every file named by
    `paths`, in dataset order.

    Each entry is a file, a folder (every file under it, sorted, skipping names starting
    with `.` or `_` such as `_SUCCESS`), or a glob (`*`, `?`, `[...]`, `**` for any depth).
    Without `filesystem`, URIs go through `pyarrow.fs.FileSystem.from_uri` and anything
    else is a local path.
    """
    paths = _path_list(paths, kind)
    if not paths:
        raise ConfigError(f"no paths given: pass a folder, a glob or a list of {kind} files")
    out: list[tuple[pafs.FileSystem, str, str, str, str]] = []
    for raw in paths:
        fs, path, display = _filesystem_of(raw, filesystem)
        if _GLOB_CHARS.search(path):
            matched = _glob(fs, path, display)
            if not matched:
                raise ConfigError(f"the glob {display!r} matches no file: check the pattern")
            root, display_root = _fixed_part(path), _fixed_part(display)
            out.extend(
                (fs, i.path, _display(display_root, root, i.path), _relative(i.path, root),
                 _version(i))
                for i in matched
            )  # fmt: skip
            continue
        info = _look_up(fs, path, display)
        if info.type == pafs.FileType.NotFound:
            raise ConfigError(f"{display}: no such file or folder (check the path)")
        if info.type == pafs.FileType.Directory:
            found = _list_folder(fs, path, display)
            if not found:
                raise ConfigError(f"the folder {display} holds no {kind} files")
            out.extend(
                (fs, i.path, _display(display, path, i.path), _relative(i.path, path),
                 _version(i))
                for i in found
            )  # fmt: skip
        else:
            out.append((fs, path, display, path.rsplit("/", 1)[-1], _version(info)))
    _refuse_repeats(out)
    return out


def _refuse_repeats(files: list[tuple[pafs.FileSystem, str, str, str, str]]) -> None:
    """A `ConfigError` naming a file that entries name twice (a folder and a folder inside
    it, two globs that overlap): every epoch would read its samples twice."""
    seen: set[tuple[str, str]] = set()
    for fs, path, display, *_ in files:
        if (fs.type_name, path) in seen:
            raise ConfigError(
                f"{display} is named twice by the paths given (entries that overlap, such as "
                "a folder and a folder inside it, or two globs): every epoch would read its "
                "rows twice. Name each file once"
            )
        seen.add((fs.type_name, path))


def _path_list(paths: object, kind: str) -> list[str]:
    """`paths` (one path or a list of them) as a list of strings; anything else is a
    `ConfigError` naming what was given."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else paths
    if isinstance(items, Iterable) and not isinstance(items, (bytes, bytearray, Mapping)):
        named = [os.fspath(p) if isinstance(p, (str, os.PathLike)) else p for p in items]
        bad = [p for p in named if not isinstance(p, str)]
        if not bad:
            return named
        given = f"{bad[0]!r} (a {type(bad[0]).__name__}) in paths"
    else:
        given = f"paths={paths!r} (a {type(paths).__name__})"
    raise ConfigError(
        f"{kind} source: {given} is not a path: pass a file, a folder or a glob (a str or "
        "os.PathLike, local or a URI), or a list of them"
    )


def _filesystem_of(
    raw: str, filesystem: pafs.FileSystem | None
) -> tuple[pafs.FileSystem, str, str]:
    if filesystem is not None:
        return filesystem, _strip_scheme(raw, filesystem), raw
    if "://" in raw:
        try:
            fs, path = pafs.FileSystem.from_uri(raw)
        except (pa.ArrowException, OSError) as error:
            raise ConfigError(f"{raw}: pyarrow cannot open this URI ({error})") from error
        return fs, path, raw
    path = os.path.abspath(raw)
    return pafs.LocalFileSystem(), path, raw


_SCHEMES = {"s3": ("s3",), "gcs": ("gs", "gcs"), "local": ("file",), "hdfs": ("hdfs",)}


def _strip_scheme(raw: str, filesystem: pafs.FileSystem) -> str:
    """A path for `filesystem`: `s3://bucket/key` with an `S3FileSystem` is `bucket/key`
    (pyarrow's filesystems take paths without a scheme); a scheme of another filesystem is
    an error naming both."""
    if "://" not in raw:
        return raw
    scheme, rest = raw.split("://", 1)
    if scheme.lower() not in _SCHEMES.get(filesystem.type_name, (filesystem.type_name,)):
        raise ConfigError(
            f"{raw}: a {scheme}:// path with filesystem={type(filesystem).__name__}; pass the "
            f"path without its scheme, or leave filesystem out so that pyarrow picks one"
        )
    return rest


def _fixed_part(pattern: str) -> str:
    """The folders of a glob before its first pattern character ("data/*/x" -> "data")."""
    parts = pattern.split("/")
    return "/".join(itertools.takewhile(lambda p: not _GLOB_CHARS.search(p), parts[:-1]))


def _display(display_root: str, root: str, path: str) -> str:
    """How errors name `path`: as the user named its folder (`display_root`), plus the
    rest of the path under `root`."""
    if path == root:
        return display_root
    rest = path[len(root.rstrip("/")) :]
    return display_root.rstrip("/") + rest if display_root else rest.lstrip("/")


def _relative(path: str, root: str) -> str:
    return path[len(root.rstrip("/")) :].lstrip("/")


def _hidden(path: str, root: str) -> bool:
    relative = path[len(root.rstrip("/")) + 1 :]
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def _version(info: pafs.FileInfo) -> str:
    """What tells one content of a file from another: its size and modification time
    (a cached copy is kept per version)."""
    size = info.size if info.size is not None else ""
    mtime = info.mtime_ns if info.mtime is not None else ""
    return f"{size}:{mtime}"


def _look_up(fs: pafs.FileSystem, target: Any, display: str) -> Any:
    """`fs.get_file_info(target)` (a path or a `FileSelector`); a store that cannot be
    reached or refuses is a `ConfigError` naming `display`, not a raw `OSError`."""
    try:
        return fs.get_file_info(target)
    except (pa.ArrowException, OSError) as error:
        raise ConfigError(
            f"{display}: cannot be looked up ({error}); check the bucket, the path and "
            "the credentials (for S3: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a role)"
        ) from error


def _list_folder(fs: pafs.FileSystem, root: str, display: str) -> list[pafs.FileInfo]:
    infos = _look_up(fs, pafs.FileSelector(root, recursive=True), display)
    files = (i for i in infos if i.type == pafs.FileType.File and not _hidden(i.path, root))
    return sorted(files, key=lambda i: i.path)


def _glob(fs: pafs.FileSystem, pattern: str, display: str) -> list[pafs.FileInfo]:
    parts = pattern.split("/")
    fixed = list(itertools.takewhile(lambda p: not _GLOB_CHARS.search(p), parts))
    root = "/".join(fixed) or "/"
    if _look_up(fs, root, display).type != pafs.FileType.Directory:
        return []
    regex = re.compile(_glob_regex(pattern))
    infos = _look_up(fs, pafs.FileSelector(root, recursive=True), display)
    files = (i for i in infos if i.type == pafs.FileType.File and regex.fullmatch(i.path))
    return sorted(files, key=lambda i: i.path)


def _glob_regex(pattern: str) -> str:
    """`**/` any folders, `*` and `?` within one name, `[...]` a character class. Like a
    folder's listing, `**` enters no hidden or `_` folder (Spark's `_temporary/`,
    `.spark-staging/`: files not committed) and takes no hidden or `_` name."""
    part = "(?![._])[^/]*"
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append(f"(?:{part}/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(f"(?:{part}/)*{part}")
            i += 2
        elif pattern[i] in "*?":  # as in a shell: not a name's leading "." (".x.crc")
            lead = "(?![.])" if i == 0 or pattern[i - 1] == "/" else ""
            out.append(lead + ("[^/]*" if pattern[i] == "*" else "[^/]"))
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1 :]:
            close = pattern.index("]", i + 1)
            body = pattern[i + 1 : close].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = close + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)
