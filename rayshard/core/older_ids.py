"""States saved by an older rayshard, whose loader id knew less of a file source.

A file source's description (what its loader's id hashes) used to name only its first
file, as the user named it (its folder too), the file count and the row count:
`ParquetSource(data/a.parquet and 2 more; 300 rows)`. It now names every file under the
dataset's root and its rows, as a digest (`rayshard.sources._identity`):
`ParquetSource(a.parquet and 2 more; 300 rows; files 0123456789abcdef)`. Every file
source's loader id changed with it, so a checkpoint saved before would be refused as
another loader's. Such a state is taken as this loader's when everything it recorded
agrees: the same settings, and a description that differs only by the digest and by the
folder before the first file's name. Those older states cannot tell two file sets of
the same first file and counts apart; states saved from now on can.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: How a file source's description writes its files' digest (`rayshard.sources._identity`).
FILES_MARK = "; files "
_DIGEST = re.compile(r"(\w+\()(.*?)((?: and \d+ more)?; \d+ rows)" + FILES_MARK + "[0-9a-f]{16}")


def older_facts_agree(saved: Any, here: Mapping[str, Any]) -> bool:
    """Whether `saved` (a state's `made_by`) is what an older rayshard recorded for the
    loader whose facts are `here`: the same keys and values, but the source's description
    as older ids wrote it (see the module docstring)."""
    if not isinstance(saved, Mapping) or saved.keys() != here.keys():
        return False
    if any(saved[key] != here[key] for key in here if key != "source"):
        return False
    return older_description_agrees(saved.get("source"), here.get("source"))


def older_description_agrees(saved: Any, here: Any) -> bool:
    """Whether `saved` is how an older rayshard described the source described as `here`
    now: `here` with its digests left out and any folder before each first file's name
    (a mix of file sources holds several)."""
    if not isinstance(saved, str) or not isinstance(here, str) or FILES_MARK in saved:
        return False
    pattern, end = [], 0
    for found in _DIGEST.finditer(here):
        kind, first, counts = found.groups()
        pattern += [re.escape(here[end : found.start()] + kind), "(?:.*/)?"]
        pattern.append(re.escape(first + counts))
        end = found.end()
    if not end:
        return False  # not a file source's description: nothing changed there
    pattern.append(re.escape(here[end:]))
    return re.fullmatch("".join(pattern), saved, re.DOTALL) is not None


__all__ = ["FILES_MARK", "older_description_agrees", "older_facts_agree"]
