"""The arguments of `Loader.iterator`, checked before the rank registers with the
coordinator or starts a reader: a bad one is refused with nothing to undo."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from rayshard.config.checks import check_int
from rayshard.data.formats import FORMATS
from rayshard.errors import ConfigError
from rayshard.runtime import pid_watch


def check_iterator_args(
    world_rank: Any, world_size: Any, batch_format: Any, device: Any, collate_fn: Any
) -> tuple[int, int]:
    """`(world_rank, world_size)` as ints, or a `ConfigError` naming the bad argument or
    environment variable (a `TypeError` for a `collate_fn` that is not callable, as for
    `transform=`)."""
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
    pid_watch.enabled()  # a bad RAYSHARD_WATCH_BY_PID: here, before the rank registers
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


def check_torch_columns(schema: pa.Schema, batch_format: str, collate_fn: Any) -> None:
    """Under `torch` without a `collate_fn` (and without a transform: the caller's part),
    a date, timestamp or duration column (numpy `datetime64`/`timedelta64`) cannot become
    a tensor: a `ConfigError` at `iterator()` naming it, not a `TypeError` at the first
    batch. (Times of day come as Python lists, as strings do.)"""
    if batch_format != "torch" or collate_fn is not None:
        return
    as_numpy_dates = (pa.types.is_date, pa.types.is_timestamp, pa.types.is_duration)
    for field in schema:
        if any(test(field.type) for test in as_numpy_dates):
            raise ConfigError(
                f"column {field.name!r} ({field.type}) cannot become a torch tensor: leave it "
                f"out with columns=, convert it in a transform or collate_fn (e.g. to int64 "
                f"with .astype('int64')), or use batch_format='numpy'"
            )
