"""What a loader's id knows of a file source: every non-empty file's name under the
dataset's root and its row count, in dataset order, as one short digest.

Not where the dataset lives: a folder moved, mounted at another path or copied between
the local disk and an object store keeps its id (a checkpoint resumes there), while
another file, another order or another row count in any file changes it. The names come
from the listing the source already made and the counts from the footers it already
read: no extra I/O.

"Under the root" is under the folder named, under a glob's fixed part (`data/*/x.parquet`:
under `data`), or the file's own name for a file named by itself. Hive partition folders
(`year=2024/`) are part of it, as their values are columns of the rows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from rayshard.core.older_ids import FILES_MARK  # (where older descriptions are read)


def named(names: Sequence[str], rows: Sequence[int]) -> tuple[str, str]:
    """The first file's name under its root, and 16 hex digits of every file's (name
    under the root, rows), in order: all a source keeps of them (it pickles small)."""
    payload = json.dumps([[n, int(r)] for n, r in zip(names, rows, strict=True)])
    return names[0], hashlib.blake2b(payload.encode(), digest_size=8).hexdigest()


def describe_files(
    kind: str, named: tuple[str, str], count: int, rows: int, options: Mapping[str, Any]
) -> str:
    """`Kind(first and n more; rows rows; files <digest>; key=value ...)`: the first
    file's name under the root, the counts, the digest (`named`), and the `options` set."""
    first, digest = named
    more = f" and {count - 1} more" if count > 1 else ""
    extra = "".join(f"; {k}={v}" for k, v in options.items() if v is not None)
    return f"{kind}({first}{more}; {rows} rows{FILES_MARK}{digest}{extra})"


__all__ = ["describe_files", "named"]
