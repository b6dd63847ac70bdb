"""A source and a transform the reader-worker tests use, in a module the reader and worker
processes can import by name."""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa

from rayshard.sources.parquet import ParquetSource

READ_PID = "read_pid"


class PidStampedSource(ParquetSource):
    """Parquet rows plus `read_pid`, the pid of the process that read them; each read
    takes `delay_s` longer (time to kill a worker with reads in flight)."""

    def __init__(self, *args, delay_s: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._delay_s = delay_s

    def schema(self) -> pa.Schema:
        return super().schema().append(pa.field(READ_PID, pa.int64()))

    def read(self, start, end, columns=None):
        time.sleep(self._delay_s)
        wanted = None if columns is None else [c for c in columns if c != READ_PID]
        for batch in super().read(start, end, wanted):
            stamp = pa.array(np.full(batch.num_rows, os.getpid(), dtype=np.int64))
            yield batch.append_column(READ_PID, stamp)


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
