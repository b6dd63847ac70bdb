"""The device feed's staging thread: read, collate, stage, hand over, timing each phase.

The phase times say where a consumer's stall comes from: a feed whose thread spends its
time in `source` waits for the loader's host batches (reading, conversion), one in `stage`
for packing and starting copies, and one in `handover` is ahead of the consumer, whose
stall (if any) then has another cause.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rayshard.data.batching import Tagged
from rayshard.device._channel import Channel
from rayshard.device._stager import Stager

END = object()
"""The item that ends a feed's stream."""


class Failure:
    """The exception the source (or `collate_fn`) raised, carried to the consumer in order."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


@dataclass
class Phases:
    """Seconds the staging thread spent in each phase; written by that thread alone."""

    source: float = 0.0  # waiting for the source's next batch, `collate_fn` included
    stage: float = 0.0  # packing the batch and starting its copy (waits for old copies too)
    handover: float = 0.0  # blocked handing a batch over (counted once the hand-over ends)


def produce(
    source: Iterator[Any],
    collate_fn: Callable[[Any], Any] | None,
    stager: Stager,
    channel: Channel,
    stop: threading.Event,
    phases: Phases,
    cpus: frozenset[int] | None,
) -> None:
    """The staging thread's body; ends the stream with `END` or a `Failure`."""
    clock = time.perf_counter
    try:
        if cpus:
            from rayshard.device.affinity import pin_current_thread

            pin_current_thread(cpus)
        with stager.thread_context():
            began = clock()
            for item in source:
                if stop.is_set():
                    return
                tag, batch = item if isinstance(item, Tagged) else (None, item)
                host = batch if collate_fn is None else collate_fn(batch)
                read = clock()
                staged = stager.stage(host)
                packed = clock()
                handed = channel.put(staged if tag is None else Tagged(tag, staged))
                phases.source += read - began
                phases.stage += packed - read
                began = clock()
                phases.handover += began - packed
                if not handed:
                    return
            channel.put(END)
    except BaseException as error:  # noqa: BLE001 - every failure belongs to the consumer
        channel.put(Failure(error))
    finally:
        stager.drain()
        LIVE.pop(threading.current_thread(), None)


def shutdown(stop: threading.Event, channel: Channel) -> None:
    """Stop a staging thread: it leaves at its next step, or at once if blocked handing over."""
    stop.set()
    channel.close()


LIVE: dict[threading.Thread, tuple[threading.Event, Channel]] = {}
"""Staging threads still running, with what stops them (see `stop_live_threads`)."""

EXIT_JOIN_TIMEOUT_S = 5.0


@atexit.register
def stop_live_threads() -> None:
    """Stop and join every staging thread before the interpreter finalizes.

    A daemon thread still running while Python finalizes is killed as soon as it takes the
    GIL again; one that was dropping a tensor at that moment unwinds through torch's C++
    frames and aborts the process, turning a finished training script's exit status into a
    crash. Each thread gets `EXIT_JOIN_TIMEOUT_S` to leave (one blocked inside the source's
    `next()` leaves when that call returns or fails)."""
    live = list(LIVE.items())
    for _thread, (stop, channel) in live:
        shutdown(stop, channel)
    for thread, _ in live:
        thread.join(EXIT_JOIN_TIMEOUT_S)
