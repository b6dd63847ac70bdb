"""How `rayshard state show` renders a state: the text table, and the Parquet row groups
its `--data` option names each split after."""

from __future__ import annotations

import json
import os
import re

import click

from rayshard.errors import ConfigError
from rayshard.plan import DataLayout

_SHOWN = 8  # consumed intervals the table lists


def parquet_splits(data: str) -> tuple[DataLayout, list[tuple[int, int]], list[str], str]:
    """The layout, row groups as sample ranges, `file#group` labels of the Parquet data
    (each file named from the files' common folder: `year=2024/part-0.parquet`), and the
    source's description (what a saved state's `made_by` names)."""
    from rayshard.sources.parquet import ParquetSource  # pyarrow: only when asked for

    try:
        source = ParquetSource(str(data))
    except ConfigError as error:
        raise click.ClickException(f"--data {data}: {error}") from error
    groups = [(f, g, a, b) for f, g, a, b in source.row_groups() if b > a]
    common = os.path.commonprefix(list(source.files))
    folder = len(common[: common.rfind("/") + 1])
    return (
        source.layout(),
        [(a, b) for _, _, a, b in groups],
        [f"{f[folder:]}#{g}" for f, g, _, _ in groups],
        source.describe(),
    )


def other_data(made_by: str, described: str) -> str | None:
    """The source a state was saved over (its `made_by`) when it is not the one
    `described`: another kind, first file's name, file count or row count, or (both
    described by this rayshard) another file or row count of any file (folders, and a
    `filter` or `split_rows` the data cannot give, are not compared: the same files
    reached from elsewhere match); else None. A state saved before `made_by` existed, or
    a description not of files, says nothing, so nothing is compared."""
    saved = json.loads(made_by).get("source") if made_by else None
    if not isinstance(saved, str):
        return None
    ours, theirs = _files_shape(described), _files_shape(saved)
    if ours is None or theirs is None:
        return None
    if None in (ours[-1], theirs[-1]):  # an older rayshard's description: no digest
        ours, theirs = ours[:-1], theirs[:-1]
    return None if ours == theirs else saved


_FILES = re.compile(r"(\w+)\((.*?)((?: and \d+ more)?); (\d+) rows(?:; files ([0-9a-f]+))?")


def _files_shape(described: str) -> tuple[str | None, ...] | None:
    """(kind, first file's name, more files, rows, digest of the files or None) of a file
    source's description."""
    found = _FILES.match(described)
    if found is None:
        return None
    kind, first, more, rows, digest = found.groups()
    return kind, first.rstrip("/").rsplit("/", 1)[-1], more, rows, digest


def table(summary: dict) -> str:
    """The text `rayshard state show` prints for a `state_tools.summarize` summary."""
    n = summary["num_samples"]
    world = summary["world_size"] or "unknown"
    pairs = summary["consumed_intervals"]
    spans = " ".join(f"[{a},{b})" for a, b in pairs[:_SHOWN]) or "-"
    if len(pairs) > _SHOWN:
        spans += f" ... ({len(pairs)} intervals; --format json lists them all)"
    lines = [
        f"state       {summary['path']}",
        f"loader      {summary['loader']}  (version {summary['version']}, seed {summary['seed']})",
        f"epoch       {summary['epoch']}",
        f"consumed    {summary['consumed']} of {n} ({summary['consumed_fraction']:.1%})",
        f"remaining   {summary['remaining']}",
        f"world size  {world}  (the size the consumed samples were planned for)",
        f"intervals   {spans}",
    ]
    splits = summary["splits"]
    if splits is not None:
        counts = {s: sum(1 for x in splits if x["status"] == s) for s in ("done", "partial")}
        untouched = len(splits) - counts["done"] - counts["partial"]
        lines.append(
            f"splits      {len(splits)}: {counts['done']} done, {counts['partial']} partial, "
            f"{untouched} untouched"
        )
        lines.append("")
        lines.extend(_split_rows(splits))
    return "\n".join(lines)


def _split_rows(splits: list[dict]) -> list[str]:
    """One row per split; runs of done or untouched splits fold into one row."""
    rows = [("split", "samples", "consumed", "status")]
    i = 0
    while i < len(splits):
        j = i + 1
        if splits[i]["status"] != "partial":
            while j < len(splits) and splits[j]["status"] == splits[i]["status"]:
                j += 1
        first, last = splits[i], splits[j - 1]
        name = first["label"] or str(first["split"])
        if j - i > 1:
            name = f"{name} .. {last['label'] or last['split']}"
        done = sum(s["consumed"] for s in splits[i:j])
        total = sum(s["total"] for s in splits[i:j])
        span = f"[{first['start']},{last['end']})"
        rows.append((name, span, f"{done}/{total}", first["status"]))
        i = j
    widths = [max(len(row[k]) for row in rows) for k in range(4)]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out
