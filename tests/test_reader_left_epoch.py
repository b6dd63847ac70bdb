"""A reader actor's epoch left behind reports no error into the next one.

`ShardReader._begin_epoch` cancels the running epoch's thread and joins it for a while; a
thread that outlives the join (blocked in a lease call, say) may fail later, when the
coordinator refuses its late call. That error belongs to the epoch left behind: the reader
thread must drop it rather than set it as the reader's error, which the new epoch's
consumers would raise. Run without Ray: the failure comes before any block is stored.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from rayshard.config.loader_config import LoaderConfig
from rayshard.errors import RayshardError, StaleClientError
from rayshard.runtime.reader import ShardReader


def reader() -> ShardReader:
    reading = SimpleNamespace(
        coordinator=None,
        source=None,
        settings=LoaderConfig(batch_size=4, policy="dynamic"),
        dp_rank=0,
        loader_id="left-epoch",
        transform=None,
    )
    return ShardReader(reading, consumers=1)


def failing_stream(cancel: threading.Event, cancel_first: bool):
    """An epoch's batches whose lease call is refused, after the epoch was cancelled or
    while it still runs."""
    if cancel_first:
        cancel.set()
    raise StaleClientError("lease of rank 0: the reading moved on to a newer call")
    yield  # a generator, as the reader's row streams are


@pytest.mark.parametrize("cancel_first", [True, False])
def test_an_error_after_the_epoch_was_cancelled_is_dropped(cancel_first):
    shard_reader = reader()
    cancel = threading.Event()
    shard_reader._read_loop(failing_stream(cancel, cancel_first), cancel, (0, 1))
    if cancel_first:
        assert shard_reader._error is None, "a left epoch's error reached the reader"
    else:  # the running epoch's own failure is the consumers' to see
        assert isinstance(shard_reader._error, RayshardError)
        assert "moved on to a newer call" in str(shard_reader._error)
