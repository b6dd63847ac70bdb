"""Acknowledgements from the iterator to the coordinator (real Ray actors)."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
import ray

from rayshard.runtime.acks import AckSender
from tests.timeouts import wait_until

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


@ray.remote(num_cpus=0)
class HeldRecorder:
    """A coordinator stand-in whose first `ack` is held until `release()`; counts how many
    calls it had at once."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.active = self.most_at_once = 0
        self.released = asyncio.Event()

    async def ack(self, generation, dp_rank, epoch, batches, ids, usage=None) -> None:
        self.active += 1
        self.most_at_once = max(self.most_at_once, self.active)
        if not self.calls:
            await self.released.wait()
        self.calls.append((epoch, batches, np.asarray(ids).tolist(), usage["batches"]))
        self.active -= 1

    async def arrived(self) -> int:
        return self.active + len(self.calls)

    async def release(self) -> None:
        self.released.set()

    async def seen(self) -> tuple[list, int]:
        return list(self.calls), self.most_at_once


def test_a_group_waits_while_the_last_one_is_not_recorded(ray_session):
    recorder = HeldRecorder.remote()
    sender = AckSender(recorder, generation=1, dp_rank=0, interval_s=60)
    sender.add(0, 1, [[0, 8]], 8, 64, 0.0)
    sender.flush()
    wait_until(lambda: ray.get(recorder.arrived.remote()) == 1, "the first group")
    # The first group is held in the coordinator: the next two flushes send nothing...
    sender.add(0, 2, [[8, 16]], 8, 64, 0.0)
    sender.flush()
    sender.add(0, 3, [[16, 24]], 8, 64, 0.0)
    sender.flush()
    ray.get(recorder.release.remote())
    sender.flush(wait=True)
    # ...and what they held goes as one group once the first was recorded.
    calls, most_at_once = ray.get(recorder.seen.remote())
    assert calls == [(0, 1, [[0, 8]], 1), (0, 3, [[8, 24]], 2)]
    assert most_at_once == 1
    sender.stop()


class InterruptedOnce(AckSender):
    """A sender whose first wait for a group is interrupted (Ctrl-C in the epoch-end wait),
    counting the groups waited for."""

    interrupt, waited = True, 0

    def _recorded(self, entry):
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt
        self.waited += 1
        return super()._recorded(entry)


def test_an_interrupted_wait_leaves_its_group_to_be_waited_for_again(ray_session):
    """`flush(wait=True)` interrupted (the iterator's epoch end: "an interrupt in the wait
    leaves the epoch to end again") keeps the group it waited for: the next wait waits for
    it, rather than returning before the coordinator recorded it."""
    recorder = HeldRecorder.remote()
    sender = InterruptedOnce(recorder, generation=1, dp_rank=0, interval_s=60)
    sender.add(0, 1, [[0, 8]], 8, 64, 0.0)
    with pytest.raises(KeyboardInterrupt):
        sender.flush(wait=True)
    ray.get(recorder.release.remote())
    sender.flush(wait=True)
    assert sender.waited == 1  # (it was forgotten: the wait returned at once)
    assert ray.get(recorder.seen.remote())[0] == [(0, 1, [[0, 8]], 1)]
    sender.stop()


def test_acknowledging_every_batch_sends_each_at_once(ray_session):
    # `interval_s=0` (acknowledge on receipt): no waiting for the group before.
    recorder = HeldRecorder.remote()
    sender = AckSender(recorder, generation=1, dp_rank=0, interval_s=0)
    sender.add(0, 1, [[0, 8]], 8, 64, 0.0)
    sender.add(0, 2, [[8, 16]], 8, 64, 0.0)
    wait_until(lambda: ray.get(recorder.arrived.remote()) == 2, "both acknowledgements")
    ray.get(recorder.release.remote())
    sender.flush(wait=True)
    calls, most_at_once = ray.get(recorder.seen.remote())
    assert sorted(calls) == [(0, 1, [[0, 8]], 1), (0, 2, [[8, 16]], 1)]
    assert most_at_once == 2
    sender.stop()


@ray.remote(num_cpus=0)
class PacingRecorder:
    """A coordinator stand-in that asks for `asked` seconds between groups."""

    def __init__(self, asked) -> None:
        self.asked, self.calls = asked, 0

    async def ack(self, generation, dp_rank, epoch, batches, ids, usage=None):
        self.calls += 1
        return self.asked


def test_the_sender_waits_the_interval_the_coordinator_asks_for(ray_session, caplog):
    caplog.set_level(logging.INFO, logger="rayshard.runtime.acks")
    recorder = PacingRecorder.remote(2.5)
    sender = AckSender(recorder, generation=1, dp_rank=0, interval_s=0.5)
    assert (sender.asked_s, sender.pause_s) == (0.0, 0.5)  # no answer yet: its own
    sender.add(0, 1, [[0, 8]], 8, 64, 0.0)
    sender.flush()  # without waiting: the answer is taken by a later flush
    wait_until(lambda: sender.flush() or sender.asked_s == 2.5, "the answer to be taken")
    assert sender.pause_s == 2.5
    told = [r.getMessage() for r in caplog.records if "asks rank 0" in r.getMessage()]
    assert len(told) == 1 and "every 2.5 s instead of ack_interval_s=0.5" in told[0]
    sender.stop()
    # a shorter interval asked than its own: it keeps its own
    shorter = AckSender(PacingRecorder.remote(0.1), generation=1, dp_rank=0, interval_s=0.5)
    shorter.add(0, 1, [[0, 8]], 8, 64, 0.0)
    shorter.flush(wait=True)
    assert (shorter.asked_s, shorter.pause_s) == (0.1, 0.5)
    shorter.stop()
    # an answer without an interval (a coordinator that does not pace) changes nothing
    silent = AckSender(PacingRecorder.remote(None), generation=1, dp_rank=0, interval_s=0.5)
    silent.add(0, 1, [[0, 8]], 8, 64, 0.0)
    silent.flush(wait=True)
    assert (silent.asked_s, silent.pause_s) == (0.0, 0.5)
    silent.stop()


@ray.remote(num_cpus=0)
class FailingRecorder:
    """A coordinator stand-in whose `ack` raises."""

    def __init__(self) -> None:
        self.calls = 0

    async def ack(self, generation, dp_rank, epoch, batches, ids, usage=None):
        self.calls += 1
        raise RuntimeError("the coordinator refused it")

    async def count(self) -> int:
        return self.calls


def test_a_failed_acknowledgement_is_logged_and_asks_for_nothing(ray_session, caplog):
    caplog.set_level(logging.WARNING, logger="rayshard.runtime.acks")
    recorder = FailingRecorder.remote()
    sender = AckSender(recorder, generation=1, dp_rank=0, interval_s=60)
    sender.add(0, 1, [[0, 8]], 8, 64, 0.0)
    sender.flush()
    wait_until(lambda: ray.get(recorder.count.remote()) == 1, "the call")

    def warned() -> bool:
        sender.flush()  # takes the answers of the calls that returned
        return any("acknowledgement call failed" in r.getMessage() for r in caplog.records)

    wait_until(warned, "the failure to be logged")
    assert "the coordinator refused it" in caplog.text
    assert (sender.asked_s, sender.pause_s) == (0.0, 60)
    sender.stop()  # the failed group was taken (logged): nothing left to wait for
