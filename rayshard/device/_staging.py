"""Lay a host batch out in one flat byte buffer, fill it, and carve typed tensors out of it.

Packing every column of a batch into one buffer means one staging buffer per batch and one
host-to-device copy per batch, however many columns it has; a jagged tensor's values,
offsets and lengths are columns too, joined again from the device views (`_jagged`).
Numpy arrays are copied into the buffer with torch's `copy_`, which splits a large copy
over torch's intra-op threads (measured on a 16-core H100 host: 111 GB/s into pinned
memory against 7.2 GB/s for single-threaded `np.copyto`, which had capped the feed at
0.14x a pinned `copy_`).

The source of that copy, and the batch itself when the target is the CPU (`host_views`),
is a tensor *viewing* the array's memory (`host_tensor`): no copy. Arrays from the Ray
object store are read-only and `torch.from_numpy` would warn about them, because torch has
no read-only tensors. `host_tensor` instead wraps the same memory in a writable numpy view
(an `__array_interface__` holder that keeps the array alive) and no warning is raised or
filtered. The consequence is documented: a CPU tensor the feed hands out may view shared
object-store memory that other processes on the node map too; it must not be modified in
place (`clone()` it first). Arrays torch cannot view (non-native byte order, negative or
unaligned strides) are copied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from rayshard.device import _jagged

ALIGN = 64
"""Byte alignment of every column inside a buffer (a cache line; enough for any dtype)."""

_NUMERIC_KINDS = frozenset("biufc")  # bool, signed, unsigned, float, complex


@dataclass(frozen=True)
class Column:
    """Where one column lives inside the flat buffer (`key`: a batch key, or a staged
    jagged tensor's `(key, part)`)."""

    key: str | tuple[str, str]
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    value: np.ndarray | torch.Tensor


@dataclass(frozen=True)
class Layout:
    """The columns to stage, the values passed through as they are (tensors already on the
    device, Python lists of strings or bytes), the tensors moved on their own (tensors on
    another device, strided nested tensors: `moved`), how to join the jagged tensors staged
    as their parts (values, offsets and, with holes, lengths), and the buffer size."""

    keys: tuple[str, ...]
    columns: tuple[Column, ...]
    passthrough: dict[str, Any]
    nbytes: int
    num_samples: int | None
    sequence: type | None = None  # tuple or list: the batch was one (keys "0", "1", ...)
    moves: dict[str, torch.Tensor] = field(default_factory=dict)
    jagged: tuple[_jagged.Jagged, ...] = ()
    arrays: tuple[tuple[str, int], ...] = ()  # lists of per-row arrays: (key, length)


def plan_layout(batch: Mapping[str, Any] | tuple | list, device: torch.device) -> Layout:
    """Decide the offset of every column; tensors already on `device` and Python lists
    that are not numbers are passed through; a CPU jagged tensor's parts are staged like
    columns (one copy covers them) and `views` joins them again; tensors on another device
    and strided nested tensors are left to `moved`, which moves each on its own. A tuple or
    list of arrays (a `collate_fn`'s `(x, y)`) is staged the same way and comes back as one;
    so is a list of per-row arrays inside it, each staged as a column."""
    sequence = type(batch) if type(batch) in (tuple, list) else None
    if sequence is not None:
        batch = {str(i): value for i, value in enumerate(batch)}
    if not isinstance(batch, Mapping):
        raise TypeError(
            f"a batch must be a dict of column name -> array, or a tuple of arrays, got "
            f"{type(batch).__name__}; make the collate_fn return one of those"
        )
    columns: list[Column] = []
    passthrough: dict[str, Any] = {}
    moves: dict[str, torch.Tensor] = {}
    jagged: list[_jagged.Jagged] = []
    arrays: list[tuple[str, int]] = []
    staged_parts: dict[int, Any] = {}  # offsets and lengths staged, by identity
    offset = 0
    num_samples = None

    def stage(key: Any, value: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        nonlocal offset
        nbytes = math.prod(shape) * dtype.itemsize
        columns.append(Column(key, offset, nbytes, shape, dtype, value))
        offset = _aligned(offset + nbytes)

    for key, value in batch.items():
        nested = isinstance(value, tuple) and not _numeric_list(list(value))
        if nested or isinstance(value, Mapping):  # (numpy would stack a tuple, casting it)
            raise TypeError(
                f"batch entry {key!r} is a {type(value).__name__} inside the batch: a batch "
                "holds arrays, tensors and lists; make the collate_fn return its parts "
                "flat, e.g. (x, labels, mask) or {'x': x, 'labels': labels, 'mask': mask}"
            )
        if isinstance(value, list) and _array_list(value):
            # per-row arrays (a tokenizer's ids): a list still, of tensors on the device
            for index, item in enumerate(value):
                dtype = (
                    item.dtype if isinstance(item, torch.Tensor) else _torch_dtype(key, item.dtype)
                )
                stage((key, index), item, dtype, tuple(item.shape))
            arrays.append((key, len(value)))
            num_samples = max(num_samples or 0, len(value))
            continue
        if isinstance(value, list) and not _numeric_list(value):
            # strings, bytes, lists per row (ragged or not): as the loop gets them
            passthrough[key] = value
            continue
        if isinstance(value, torch.Tensor):
            if value.device == device:
                passthrough[key] = value
                continue
            if _jagged.stageable(value):
                join, parts = _jagged.plan(key, value, staged_parts)
                jagged.append(join)
                for column, tensor in parts:
                    stage(column, tensor, tensor.dtype, tuple(tensor.shape))
                num_samples = max(num_samples or 0, value.size(0)) or None
                continue
            if value.is_nested or value.device.type != "cpu":
                moves[key] = value
                continue
            dtype, shape = value.dtype, tuple(value.shape)
        else:
            value = np.asarray(value)
            dtype, shape = _torch_dtype(key, value.dtype), value.shape
        if shape:  # the longest leading dimension is the batch size
            num_samples = max(num_samples or 0, shape[0]) or None
        stage(key, value, dtype, shape)
    return Layout(
        tuple(batch),
        tuple(columns),
        passthrough,
        offset,
        num_samples,
        sequence,
        moves,
        tuple(jagged),
        tuple(arrays),
    )


def moved(layout: Layout, device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors `plan_layout` left to move on their own, on `device`. On CUDA the stager
    calls this on its copy stream, so the copy's event covers these moves too."""
    asynchronous = device.type == "cuda"  # (to the CPU: a non-blocking copy is not awaited)
    return {
        key: value.to(device, non_blocking=asynchronous and not value.is_nested)
        for key, value in layout.moves.items()
    }


def fill(buffer: torch.Tensor, layout: Layout) -> None:
    """Copy every column of `layout` into its place in the flat host `buffer`."""
    with torch.no_grad():
        for column, target in zip(layout.columns, _typed_views(buffer, layout), strict=True):
            source = column.value
            if not isinstance(source, torch.Tensor):
                source = host_tensor(source)
            if source is None:  # torch cannot view it: numpy converts while copying
                np.copyto(target.numpy(), column.value, casting="equiv")
            else:
                target.copy_(source)


def host_views(layout: Layout) -> dict[str, Any]:
    """The batch on the CPU without a copy: each numpy column as a tensor viewing its
    memory (a copy only where torch cannot view it), tensors and passed-through values as
    they are (tensors on a device moved to the CPU), in the source's key order."""
    staged = {}
    for column in layout.columns:
        value = column.value
        if not isinstance(value, torch.Tensor):
            value = host_tensor(value)
            if value is None:
                native = column.value.astype(column.value.dtype.newbyteorder("="), order="C")
                value = torch.from_numpy(native)
        staged[column.key] = value
    staged.update(layout.passthrough)
    staged.update(moved(layout, torch.device("cpu")))
    return _assembled(staged, layout)


def _assembled(staged: dict[Any, Any], layout: Layout) -> Any:
    """The staged values in the batch's own shape: a dict in its key order, or the tuple
    or list it was, each list of per-row arrays a list of their tensors again."""
    for key, length in layout.arrays:
        staged[key] = [staged[key, index] for index in range(length)]
    if layout.sequence is not None:
        return layout.sequence(staged[key] for key in layout.keys)
    return {key: staged[key] for key in layout.keys}


class _WritableView:
    """Exports an array's memory as writable through `__array_interface__`, holding the
    array (and so its object-store buffer) alive for as long as a view of it lives."""

    __slots__ = ("__array_interface__", "owner")


def host_tensor(array: np.ndarray) -> torch.Tensor | None:
    """A CPU tensor viewing `array`'s memory (no copy, no warning for read-only arrays),
    or None if torch cannot view it (non-native byte order, strides torch cannot hold)."""
    dtype = array.dtype
    if dtype.kind not in _NUMERIC_KINDS or not dtype.isnative:
        return None
    if any(stride < 0 or stride % dtype.itemsize for stride in array.strides):
        return None
    if not array.flags.writeable:
        holder = _WritableView()
        holder.owner = array
        holder.__array_interface__ = {
            "shape": array.shape,
            "typestr": dtype.str,
            "data": (array.__array_interface__["data"][0], False),
            "strides": array.strides,
            "version": 3,
        }
        array = np.asarray(holder)
    return torch.from_numpy(array)


def views(
    buffer: torch.Tensor, layout: Layout, moves: Mapping[str, torch.Tensor] | None = None
) -> dict[str, Any]:
    """The batch as tensors viewing `buffer` (host or device) with the passed-through values
    and the `moved` tensors, in the source's key order."""
    staged = {c.key: t for c, t in zip(layout.columns, _typed_views(buffer, layout), strict=True)}
    for join in layout.jagged:  # joined again from its staged parts: views of `buffer` too
        staged[join.key] = _jagged.join(join, staged)
    staged.update(layout.passthrough)
    staged.update(moves or {})
    return _assembled(staged, layout)


def _typed_views(buffer: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    return [
        buffer[c.offset : c.offset + c.nbytes].view(c.dtype).view(c.shape) for c in layout.columns
    ]


def _array_list(value: list) -> bool:
    """A list of numeric arrays or host tensors of at least one dimension, one per row,
    which is staged item by item (a device gets tensors it can use; the list stays a list,
    whatever the shapes)."""
    return bool(value) and all(_row_array(item) for item in value)


def _row_array(item: Any) -> bool:
    if isinstance(item, np.ndarray):
        return item.ndim > 0 and item.dtype.kind in _NUMERIC_KINDS
    if isinstance(item, torch.Tensor):
        return item.ndim > 0 and not item.is_nested and item.device.type == "cpu"
    return False


def _numeric_list(value: list) -> bool:
    """A flat list of numbers (a `collate_fn`'s), which is staged as a tensor; a list of
    lists or arrays (one per row) is not, whatever its shape, so its type never depends on
    the batch. An empty list (a batch whose rows a transform all dropped) is not: its
    column is text or lists as often as numbers, and stays a list."""
    if not value or any(isinstance(item, (list, tuple)) or np.ndim(item) > 0 for item in value):
        return False
    try:
        return np.asarray(value).dtype.kind in _NUMERIC_KINDS
    except ValueError:  # ragged nesting
        return False


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _torch_dtype(key: str, dtype: np.dtype) -> torch.dtype:
    if dtype.kind not in _NUMERIC_KINDS:
        raise TypeError(
            f"column {key!r} has numpy dtype {dtype} (kind {dtype.kind!r}), which torch cannot "
            f"hold: drop the column or encode it as numbers in collate_fn="
        )
    return _native_torch_dtype(dtype.newbyteorder("="))


@lru_cache(maxsize=64)
def _native_torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
