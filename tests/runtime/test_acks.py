"""Acknowledgements from the iterator to the coordinator (real Ray actors)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import ray

from rayshard.runtime.acks import AckSender

pytestmark = [pytest.mark.ray]


@ray.remote(num_cpus=0)
class SlowRecorder:
    """Records `ack` calls after a delay, like a busy coordinator."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def ack(self, generation, dp_rank, epoch, batches, ids, usage=None) -> None:
        await asyncio.sleep(0.5)
        # the runs arrive as one (n, 2) int64 array
        self.calls.append((epoch, batches, np.asarray(ids).tolist(), usage["samples"]))

    async def recorded(self) -> list[tuple]:
        return list(self.calls)


def test_flush_wait_returns_only_once_everything_was_recorded(ray_session):
    recorder = SlowRecorder.remote()
    sender = AckSender(recorder, generation=1, dp_rank=0, interval_s=60)
    sender.add(0, 1, [[0, 8]], 8, 64, 0.0)
    sender.flush()  # without waiting: still on its way
    sender.add(0, 2, [[8, 16]], 8, 64, 0.0)
    sender.add(1, 1, [[0, 4]], 4, 32, 0.0)
    sender.flush(wait=True)
    calls = ray.get(recorder.recorded.remote())
    assert sorted(calls) == [(0, 1, [[0, 8]], 8), (0, 2, [[8, 16]], 8), (1, 1, [[0, 4]], 4)]


def test_stop_sends_and_waits_for_what_is_pending(ray_session):
    recorder = SlowRecorder.remote()
    sender = AckSender(recorder, generation=1, dp_rank=0, interval_s=60)
    sender.add(2, 5, [[40, 50]], 10, 80, 0.1)
    sender.stop()
    assert ray.get(recorder.recorded.remote()) == [(2, 5, [[40, 50]], 10)]


def test_consecutive_batches_are_acknowledged_as_one_run(ray_session):
    recorder = SlowRecorder.remote()
    sender = AckSender(recorder, generation=1, dp_rank=0, interval_s=60)
    sender.add(0, 1, [[0, 8]], 8, 64, 0.0)
    sender.add(0, 2, [[8, 16]], 8, 64, 0.0)
    sender.add(0, 3, [[20, 24], [24, 30]], 10, 80, 0.0)  # a gap, then touching runs
    sender.stop()
    assert ray.get(recorder.recorded.remote()) == [(0, 3, [[0, 16], [20, 30]], 26)]
