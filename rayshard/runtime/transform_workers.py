"""Transform workers: a rank's transform in `transform_workers` (or `reader_workers`)
processes instead of one.

The reader hands its batches to the workers in turns, a group of consecutive batches per
call (`rayshard.runtime.reader_workers`, whose docstring says where the workers run and
what happens when one dies), and yields the results in batch order, so the output (its
order included) is the one a single reader would produce. With `transform_workers` the
reader still reads, shuffles and rebatches on its own thread; with `reader_workers` the
same workers read too.

A call costs the reader about a millisecond of CPU whatever it carries (the actor call,
its arguments' and result's trips through the object store), so a cheap transform sent
one batch per call costs the reader more than running it itself. `GroupSize` sizes the
groups by the transform time the workers report: a call carries about `CALL_SECONDS` of
transform (a slow transform still goes one batch per call: every worker busy from the
first batches), at most `GROUP_BATCHES` batches and, past its first batch,
`GROUP_BYTES` bytes.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator
from typing import Any

from rayshard.core.stragglers import GROUP_BATCHES, TRANSFORM_AHEAD
from rayshard.data.batching import FLUSH
from rayshard.runtime.block import column_bytes
from rayshard.runtime.reader_workers import worker_result

CALL_SECONDS = 0.02  # transform time per call worth its overhead
GROUP_BYTES = 4 << 20  # a group's bytes at most (past its first batch)


class GroupSize:
    """Batches per call: `CALL_SECONDS` over the transform's seconds per batch, as the
    workers last reported it, within 1..`GROUP_BATCHES`. One until the first report."""

    def __init__(self) -> None:
        self.batches = 1

    def observe(self, seconds: float, batches: int) -> None:
        """A call of `batches` batches took the worker `seconds` of transform."""
        if batches:
            per_batch = max(seconds / batches, 1e-9)
            self.batches = max(1, min(GROUP_BATCHES, math.floor(CALL_SECONDS / per_batch)))


def batch_groups(batches: Iterator[Any], size: GroupSize) -> Iterator[Any]:
    """Consecutive batches as lists of up to `size.batches` batches (and `GROUP_BYTES`
    bytes past the first); a `FLUSH` ends the group being filled and passes on."""
    group: list[Any] = []
    nbytes = 0
    for batch in batches:
        if batch is FLUSH:
            if group:
                yield group
            group, nbytes = [], 0
            yield FLUSH
            continue
        weight = sum(column_bytes(value) for value in batch.values())
        if group and nbytes + weight > GROUP_BYTES:
            yield group
            group, nbytes = [], 0
        group.append(batch)
        nbytes += weight
        if len(group) >= size.batches:
            yield group
            group, nbytes = [], 0
    if group:
        yield group


def parallel_transform_stream(
    batches: Iterator[Any], workers: list, epoch: int, ahead: int = TRANSFORM_AHEAD
) -> Iterator[Any]:
    """The transformed `batches`, in order, `ahead` calls per worker in flight. A `FLUSH`
    waits for every batch before it, then passes on. A transform's error is raised after
    the results of the batches before it."""
    size = GroupSize()
    pending: collections.deque = collections.deque()
    sent = 0
    for group in batch_groups(batches, size):
        if group is FLUSH:
            while pending:
                yield from _results(pending.popleft(), size)
            yield FLUSH
            continue
        pending.append(workers[sent % len(workers)].apply_batches.remote(group, epoch))
        sent += 1
        while len(pending) >= ahead * len(workers):
            yield from _results(pending.popleft(), size)
    while pending:
        yield from _results(pending.popleft(), size)


def _results(ref: Any, size: GroupSize) -> Iterator[Any]:
    """One call's transformed batches, then the error that stopped it, if any."""
    results, error, seconds = worker_result(ref)
    size.observe(seconds, len(results) + (error is not None))
    yield from results
    if error is not None:
        raise error
