"""How often the coordinator asks each consumer to acknowledge, so that acknowledgements
alone would take at most a share of one core.

Every acknowledgement group is a Ray call to one actor, about half a millisecond of its
CPU or more whatever it carries. With thousands of consumers each sending a group every
`ack_interval_s`, the calls outrun it: before, each consumer's one group in flight set the
pace, the actor's queue held about one call per consumer, and every other call (a lease,
a `state()`) waited behind them (0.55 s at 1,000 ranks here). Instead the coordinator
measures its CPU per call (every journaled command: acknowledgements, leases,
registrations) and answers each group with the interval at which its consumers' groups
would take `utilization` of one core at that cost, never below `ack_interval_s`. With
stragglers on it never passes a quarter of `straggler_timeout_s`: a healthy rank with one
group in flight may skip a round while the last is queued, and must still acknowledge
within the timeout. Its queue then stays short.

The cost is per call of any kind, so the coordinator's other work does not feed back into
the acknowledgement interval (CPU divided by acknowledgements only would grow as they
space out). Past what one actor's calls can carry, the answer also tells the consumers to
send through their node's relay (`AckAnswer.relay`, `rayshard.runtime.ack_relay`), which
gathers a node's groups into one call. Pure: times and CPU seconds come in as arguments."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from rayshard.config.loader_config import LoaderConfig


@dataclasses.dataclass(frozen=True)
class AckAnswer:
    """The coordinator's answer to an acknowledgement group: the interval it asks for, and
    whether the consumer should send its groups through its node's relay."""

    interval_s: float
    relay: bool = False


@dataclasses.dataclass
class AckPacing:
    """Measures the coordinator's CPU per call over windows of `window_s` and says how
    often each consumer should send an acknowledgement group."""

    ack_interval_s: float  # the configured interval: the shortest ever asked
    max_interval_s: float = math.inf  # the longest ever asked (a quarter of the straggler timeout)
    utilization: float = 0.8  # share of one core the acknowledgements may take
    window_s: float = 1.0  # measurement window (wall seconds)
    min_calls: int = 20  # calls a window needs to give a measurement
    cost_s: float = 0.0  # CPU seconds per call, smoothed (0 until measured)
    # start time, start CPU and calls of the window being measured
    _window: tuple[float, float, int] | None = dataclasses.field(
        default=None, init=False, repr=False
    )

    @classmethod
    def for_settings(cls, settings: LoaderConfig) -> AckPacing:
        """Pacing within a loader's settings (`ack_interval_s`, `straggler_timeout_s`)."""
        timeout = settings.straggler_timeout_s
        return cls(settings.ack_interval_s, math.inf if timeout is None else timeout / 4)

    def called(self, now: float, cpu_s: float | Callable[[], float]) -> None:
        """One call was handled at wall time `now`, with the process at `cpu_s` CPU
        seconds, or a function giving them: called only when a window starts or ends
        (reading a process's CPU clock is a system call, a few per cent of a call)."""
        if self._window is None:
            self._window = (now, _value(cpu_s), 0)
            return
        began, cpu_began, calls = self._window
        calls += 1
        if now - began < self.window_s or calls < self.min_calls:
            self._window = (began, cpu_began, calls)
            return
        cpu_now = _value(cpu_s)
        cost = max(0.0, cpu_now - cpu_began) / calls
        self.cost_s = cost if self.cost_s == 0.0 else 0.5 * (self.cost_s + cost)
        self._window = (now, cpu_now, 0)

    def interval_s(self, consumers: int) -> float:
        """The interval each of `consumers` should acknowledge at: the configured one, or
        longer so that all their calls take at most `utilization` of a core."""
        if self.ack_interval_s <= 0:  # every batch acknowledged: exactness asked for
            return self.ack_interval_s
        needed = max(0, consumers) * self.cost_s / self.utilization
        longest = max(self.ack_interval_s, self.max_interval_s)
        return min(max(self.ack_interval_s, needed), longest)

    def answer(self, consumers: int, relay_mode: str = "off") -> AckAnswer:
        """The answer to a group: `interval_s`, and relaying asked for always (`node`),
        never (`off`), or (`auto`) once the calls outrun this actor at `ack_interval_s`."""
        interval = self.interval_s(consumers)
        paced = interval > self.ack_interval_s
        return AckAnswer(interval, relay_mode == "node" or (relay_mode == "auto" and paced))


def _value(cpu_s: float | Callable[[], float]) -> float:
    return cpu_s() if callable(cpu_s) else cpu_s


__all__ = ["AckAnswer", "AckPacing"]
