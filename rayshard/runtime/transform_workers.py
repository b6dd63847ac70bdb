"""Transform workers: a rank's transform in `transform_workers` (or `reader_workers`)
processes instead of one.

The reader hands batch `j` to worker `j % k` (`rayshard.runtime.reader_workers`, whose
docstring says where the workers run and what happens when one dies) and yields the results
in batch order, so the output (its order included) is the one a single reader would
produce. With `transform_workers` the reader still reads, shuffles and rebatches on its own
thread; with `reader_workers` the same workers read too.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from rayshard.data.batching import FLUSH
from rayshard.runtime.reader_workers import worker_result


def parallel_transform_stream(
    batches: Iterator[Any], workers: list, epoch: int, ahead: int = 2
) -> Iterator[Any]:
    """The transformed `batches`, in order, `ahead` batches per worker in flight. A `FLUSH`
    waits for every batch before it, then passes on."""
    pending: collections.deque = collections.deque()
    sent = 0
    for batch in batches:
        if batch is FLUSH:
            while pending:
                yield worker_result(pending.popleft())
            yield FLUSH
            continue
        pending.append(workers[sent % len(workers)].apply.remote(batch, epoch))
        sent += 1
        while len(pending) >= ahead * len(workers):
            yield worker_result(pending.popleft())
    while pending:
        yield worker_result(pending.popleft())
