"""Where a reader runs the user's transform: between rebatching and the object store.

`transform_input` turns an Arrow slice into the dict a transform sees (string and binary
columns as Python lists); `apply_transform` runs the function on one batch, checks what
it returned and records the samples it dropped under `DROPPED_KEY`, which the iterator
takes out of the batch and acknowledges with the batch (dropped samples count as
consumed). Failures become `TransformError`s naming the loader, rank, epoch and samples.
Pure functions, testable without Ray.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.data.batching import FLUSH, to_numpy
from rayshard.data.columns import OFFSETS_SUFFIX, ColumnRules
from rayshard.data.ragged import UNVIEWED
from rayshard.data.transforms import INDEX_KEY, PADDED_KEY, TransformContext
from rayshard.errors import TransformError

DROPPED_KEY = "_dropped"  # real samples a transform dropped from this batch (int64)


def transform_input(table: pa.Table, rules: ColumnRules | None = None) -> dict[str, Any]:
    """The columns as the loader delivers them without a transform (`to_numpy` under the
    loader's column rules: padded lists with their `_lengths`/`_mask`, filled nulls),
    except string and binary columns: Python lists (nulls filled under `fill_null`, else
    None), and `nested` columns: a list of per-row arrays (one entry per row, as every
    column of a transform's batch has)."""
    as_lists = [name for name, kind in zip(table.column_names, table.schema.types) if _text(kind)]
    rules = rules or ColumnRules()
    arrays = to_numpy(table.drop_columns(as_lists), rules)
    lists = {}
    for name in as_lists:
        column = table.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        has_fill, fill = rules.fill_of(name)
        if has_fill and column.null_count:  # (views have no fill kernel: their large kind)
            column = column.cast(UNVIEWED.get(str(column.type), column.type))
            column = column.fill_null(pa.scalar(fill).cast(column.type))
        lists[name] = column.to_pylist()
    for name in rules.nested_columns(table.schema):  # values + offsets: rows as arrays
        offsets, values = arrays.pop(name + OFFSETS_SUFFIX), arrays[name]
        arrays[name] = [values[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    out = {name: lists[name] if name in lists else arrays[name] for name in table.column_names}
    out.update((key, value) for key, value in arrays.items() if key not in out)  # derived
    return out


def _text(kind: pa.DataType) -> bool:
    """String and binary types, dictionary-encoded ones (as pandas writes them) and views
    (as polars writes Arrow IPC) included."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return str(kind) in ("string_view", "binary_view") or (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
    )


def transform_stream(
    batches: Iterator[Any], fn: Any, *, loader: str, seed: int, epoch: int, rank: int
) -> Iterator[Any]:
    """`apply_transform` on every batch of a reader's stream (`FLUSH` markers pass)."""
    for batch in batches:
        if batch is FLUSH:
            yield batch
            continue
        ctx = TransformContext(
            loader=loader,
            seed=seed,
            epoch=epoch,
            rank=rank,
            indices=np.asarray(batch[INDEX_KEY]),
            padded=np.asarray(batch[PADDED_KEY]),
        )
        yield apply_transform(fn, batch, ctx)


def apply_transform(fn: Any, batch: dict[str, Any], ctx: TransformContext) -> dict[str, Any]:
    """Run `fn(batch, ctx)` and check its result: same rows, or a subset of them that keeps
    `_index` and `_padded`. The real samples left out go under `DROPPED_KEY`."""
    try:
        out = fn(batch, ctx)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - reported with its batch (a
        # worker process that exited instead was restarted and its call retried, forever)
        raise transform_error(ctx, f"raised {error!r}", traceback.format_exc()) from None
    return _checked(out, ctx)


def _checked(out: Any, ctx: TransformContext) -> dict[str, Any]:
    if not isinstance(out, Mapping) or not out:
        raise transform_error(
            ctx, f"returned {_describe(out)}: return a dict of column -> array (or list)"
        )
    if DROPPED_KEY in out:
        raise transform_error(ctx, f"returned a column {DROPPED_KEY!r}: that name is rayshard's")
    out = dict(out)
    rows = {key: _rows(key, value, ctx) for key, value in out.items()}
    counts = set(rows.values())
    if len(counts) > 1:
        raise transform_error(ctx, f"returned columns of different lengths: {rows}")
    (count,) = counts
    n = len(ctx.indices)
    if count > n:
        raise transform_error(
            ctx, f"returned {count} rows for {n}: a transform may drop rows, not add them"
        )
    if INDEX_KEY not in out:
        if count != n:
            raise transform_error(
                ctx,
                f"returned {count} rows of {n} without {INDEX_KEY!r}: to drop rows, keep "
                f"{INDEX_KEY!r} and {PADDED_KEY!r} for the rows kept "
                f"(rayshard.data.transforms.keep_rows(batch, mask) does)",
            )
        out[INDEX_KEY], out[PADDED_KEY] = ctx.indices, ctx.padded
    elif PADDED_KEY not in out:
        if count != n:
            raise transform_error(ctx, f"kept {INDEX_KEY!r} but not {PADDED_KEY!r}: keep both")
        out[PADDED_KEY] = ctx.padded
    index = np.asarray(out.pop(INDEX_KEY), dtype=np.int64)
    padded = np.asarray(out.pop(PADDED_KEY), dtype=bool)
    out[INDEX_KEY], out[PADDED_KEY] = index, padded
    if np.array_equal(index, ctx.indices) and np.array_equal(padded, ctx.padded):
        return out  # every row kept (the usual case): nothing unknown, repeated or dropped
    real_in = ctx.indices[~ctx.padded]
    kept = index[~padded]
    # membership by `isin` and repeats by a sort: numpy's `unique`/`setdiff1d` cost about
    # 10x the rest of the reader's work on a batch
    unknown = np.unique(kept[~np.isin(kept, real_in)])
    ordered = np.sort(kept)
    if unknown.size or (ordered[1:] == ordered[:-1]).any():
        raise transform_error(
            ctx,
            f"returned {INDEX_KEY!r} values that are not rows of its batch, or repeats "
            f"(e.g. {unknown[:5].tolist() or kept.tolist()[:5]}): rows may only be dropped",
        )
    dropped = np.unique(real_in[~np.isin(real_in, kept)]).astype(np.int64)
    if dropped.size:
        out[DROPPED_KEY] = dropped
    return out


def _rows(key: str, value: Any, ctx: TransformContext) -> int:
    if isinstance(value, np.ndarray) and value.ndim >= 1:
        return value.shape[0]
    if isinstance(value, (list, tuple)):
        return len(value)
    raise transform_error(
        ctx,
        f"returned column {key!r} as {_describe(value)}: every column must be a numpy array "
        f"with a row dimension, or a list",
    )


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.ndim}-d numpy array"
    return f"a {type(value).__name__}" if value is not None else "None"


def transform_error(ctx: TransformContext, what: str, details: str = "") -> TransformError:
    """A `TransformError` naming the loader, rank, epoch and samples of `ctx`."""
    indices = np.asarray(ctx.indices)
    first, last = (int(indices.min()), int(indices.max())) if indices.size else (0, -1)
    message = (
        f"transform of loader {ctx.loader!r} {what} on data-parallel rank {ctx.rank}, "
        f"epoch {ctx.epoch}, a batch of {indices.size} rows with sample indices in "
        f"[{first}, {last}]"
    )
    if details:
        message += f"\n--- the transform's traceback (reader process) ---\n{details.rstrip()}"
    return TransformError(message, ctx.loader, ctx.rank, ctx.epoch, (first, last + 1))
