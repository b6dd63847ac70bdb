"""A source and a transform the reader-worker tests use, and a block server for the fetch
tests, in a module the reader and worker processes can import by name."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa

from rayshard.runtime.block import Block, tag_batch
from rayshard.sources.parquet import ParquetSource

READ_PID = "read_pid"
READ_THREAD = "read_thread"
READ_NODE = "read_node"
STAMPS = (READ_PID, READ_THREAD)


class PidStampedSource(ParquetSource):
    """Parquet rows plus `read_pid` and `read_thread`, the process and thread that read
    them; each read takes `delay_s` longer (time to kill a worker with reads in flight)."""

    def __init__(self, *args, delay_s: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._delay_s = delay_s

    def schema(self) -> pa.Schema:
        schema = super().schema().append(pa.field(READ_PID, pa.int64()))
        return schema.append(pa.field(READ_THREAD, pa.int64()))

    def read(self, start, end, columns=None):
        time.sleep(self._delay_s)
        wanted = None if columns is None else [c for c in columns if c not in STAMPS]
        for batch in super().read(start, end, wanted):
            for name, value in ((READ_PID, os.getpid()), (READ_THREAD, threading.get_ident())):
                stamp = pa.array(np.full(batch.num_rows, value, dtype=np.int64))
                batch = batch.append_column(name, stamp)
            yield batch


class EmptyFirstSource(ParquetSource):
    """Parquet rows, each read starting with an empty record batch (the `Source.read`
    contract allows it; a table with an empty chunk gives one)."""

    def read(self, start, end, columns=None):
        for batch in super().read(start, end, columns):
            yield batch.slice(0, 0)
            yield batch


class NodeStampedSource(ParquetSource):
    """Parquet rows plus `read_node`, the Ray node id of the process that read them."""

    def schema(self) -> pa.Schema:
        return super().schema().append(pa.field(READ_NODE, pa.string()))

    def read(self, start, end, columns=None):
        import ray

        node = ray.get_runtime_context().get_node_id()
        wanted = None if columns is None else [c for c in columns if c != READ_NODE]
        for batch in super().read(start, end, wanted):
            yield batch.append_column(READ_NODE, pa.array([node] * batch.num_rows))


def slow_stamped(batch, ctx):
    """Per-sample random values, the pids that read and transformed each row; 30 ms a
    batch (time to kill a worker mid-epoch)."""
    time.sleep(0.03)
    return {
        "id": batch["id"],
        READ_PID: batch[READ_PID],
        "noise": np.array([ctx.rng(row).random() for row in range(len(ctx))]),
        "pid": np.full(len(ctx), os.getpid()),
    }


BLOCKS = 6  # blocks a `BlockServer` serves


class BlockServer:
    """Serves `BLOCKS` one-batch blocks of (generation 0, epoch 1) like a reader's `next`,
    recording every index asked for; `wrong_at` answers a block of another epoch there;
    `text` adds a `large_string` column as a reader ships it (Arrow)."""

    def __init__(self, wrong_at: int | None = None, text: bool = False) -> None:
        self.asked: list[int] = []
        self.wrong_at = wrong_at
        self.text = text

    def next(self, generation: int, epoch: int, index: int, run: int | None = None, member=None):
        import ray

        self.asked.append(index)
        if index >= BLOCKS:
            return None
        batch = {"_index": np.array([index]), "_padded": np.array([False])}
        if self.text:
            import pyarrow as pa

            batch["s"] = pa.array([f"row {index}"], pa.large_string())
        epoch = epoch + 1 if index == self.wrong_at else epoch
        return ray.put(Block.of((generation, epoch), index, [tag_batch(batch)]))

    def requests(self) -> list[int]:
        return self.asked
