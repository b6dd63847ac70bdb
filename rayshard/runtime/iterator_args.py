"""The arguments of `Loader.iterator`, checked before the rank registers with the
coordinator or starts a reader: a bad one is refused with nothing to undo."""

from __future__ import annotations

from typing import Any

from rayshard.config.checks import check_int
from rayshard.data.formats import FORMATS
from rayshard.errors import ConfigError


def check_iterator_args(
    world_rank: Any, world_size: Any, batch_format: Any, device: Any, collate_fn: Any
) -> tuple[int, int]:
    """`(world_rank, world_size)` as ints, or a `ConfigError` naming the bad argument
    (a `TypeError` for a `collate_fn` that is not callable, as for `transform=`)."""
    size = check_int(
        world_size, "world_size", minimum=1, integral=True, fix="the number of training workers"
    )
    rank = check_int(
        world_rank, "world_rank", minimum=0, integral=True, fix="this worker's rank, from 0"
    )
    if not isinstance(batch_format, str) or batch_format not in FORMATS:
        raise ConfigError(
            f"batch_format={batch_format!r} is not a valid choice: use one of {', '.join(FORMATS)}"
        )
    if collate_fn is not None and not callable(collate_fn):
        raise TypeError(
            f"collate_fn={collate_fn!r} is not callable: pass a function batch -> batch, or None"
        )
    if device is not None:
        _check_device(device)
    return int(rank), int(size)


def _check_device(device: Any) -> None:
    """`device` names a torch device ('cpu', 'cuda', 'cuda:1', a `torch.device`) that this
    process has: the iterator is made in the process that uses it, so a CUDA device
    without CUDA fails here, at `iterator()`, not at the first batch."""
    import torch

    from rayshard.device.feed import check_available

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as error:
        reason = str(error).strip().splitlines()[0]
        raise ConfigError(
            f"device={device!r} is not a torch device ({reason}): pass e.g. 'cpu', 'cuda', "
            "'cuda:0' or a torch.device, or leave it unset"
        ) from None
    check_available(parsed)
