"""A CPU jagged tensor staged as its parts: values, offsets and (with holes) lengths ride
the batch's one staging buffer and copy, and are joined again from the device views.

Joined, the tensor keeps what `.to(device)` would have kept: its min and max sequence
lengths (taken from the original's cache, or computed here on the CPU from its offsets,
so neither `to_padded_tensor` nor attention needs a device sync to learn them), and the
ragged size it shares with other columns built on the same offsets (`input_ids` and
`labels`: one offsets column staged once, and the same view given to both, so they stay
shape-compatible).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

PARTS = ("values", "offsets", "lengths")


@dataclass(frozen=True)
class Jagged:
    """How to join one jagged column again: each part's column key in the buffer (another
    column's, for offsets it shares), and its sequence lengths."""

    key: str
    parts: tuple[tuple[str, Any], ...]  # (part, column key)
    min_seqlen: int | None
    max_seqlen: int | None


def stageable(value: torch.Tensor) -> bool:
    """A CPU jagged tensor ragged in the dimension after the batch's, on a torch that can
    join one with its sequence lengths (elsewhere it is moved whole)."""
    return (
        value.is_nested
        and value.layout == torch.jagged
        and value.device.type == "cpu"
        and getattr(value, "_ragged_idx", None) == 1
        and _joins_with_seqlens()
    )


def plan(
    key: str, value: torch.Tensor, staged: dict[int, Any]
) -> tuple[Jagged, list[tuple[Any, torch.Tensor]]]:
    """The join of `value` and the (column key, tensor) parts to stage for it; `staged`
    maps the offsets and lengths tensors staged so far (by identity) to their columns, and
    a part already there is not staged again."""
    new, parts = [], []
    for part, tensor in zip(PARTS, (value.values(), value.offsets(), value.lengths())):
        if tensor is None:
            continue
        if part != "values" and id(tensor) in staged:
            parts.append((part, staged[id(tensor)]))
            continue
        column = (key, part)
        if part != "values":
            staged[id(tensor)] = column
        new.append((column, tensor))
        parts.append((part, column))
    return Jagged(key, tuple(parts), *_seqlens(value)), new


def join(jagged: Jagged, columns: dict[Any, torch.Tensor]) -> torch.Tensor:
    """The jagged tensor from its parts' views (no copy, no device sync)."""
    parts = {part: columns[column] for part, column in jagged.parts}
    return torch.nested.nested_tensor_from_jagged(
        **parts, min_seqlen=jagged.min_seqlen, max_seqlen=jagged.max_seqlen
    )


def _seqlens(value: torch.Tensor) -> tuple[int | None, int | None]:
    low = getattr(value, "_maybe_min_seqlen", None)
    high = getattr(value, "_maybe_max_seqlen", None)
    if low is None or high is None:
        lengths = value.lengths() if value.lengths() is not None else value.offsets().diff()
        if not lengths.numel():
            return None, None
        low, high = lengths.min(), lengths.max()  # on the CPU: no device involved
    return int(low), int(high)


@lru_cache(maxsize=1)
def _joins_with_seqlens() -> bool:
    signature = inspect.signature(torch.nested.nested_tensor_from_jagged)
    return "max_seqlen" in signature.parameters
