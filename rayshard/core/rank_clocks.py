"""The straggler clock of every rank of a `dynamic` epoch: when it last took a lease or
acknowledged a batch. Held in an array indexed by rank, because an idle rank's lease asks
which ranks are silent, and with 10,000 ranks a scan of a dict per ask costs half a Ray
call (0.64 ms); the array's costs microseconds."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class RankClocks:
    """Times by rank (non-negative ints); a rank without a clock is never silent."""

    def __init__(self, times: Iterable[Iterable[float]] = ()) -> None:
        self._times = np.full(0, np.nan)
        self._count = 0  # ranks with a clock (asked for on every lease)
        for rank, time in times:
            self.touch(int(rank), float(time))

    def __len__(self) -> int:
        return self._count

    def touch(self, rank: int, now: float) -> None:
        """`rank` made progress at `now`."""
        if rank < 0:  # an index from the end would move another rank's clock
            raise ValueError(f"rank {rank} is negative: ranks are counted from 0")
        if rank >= len(self._times):
            grown = np.full(max(rank + 1, 2 * len(self._times)), np.nan)
            grown[: len(self._times)] = self._times
            self._times = grown
        self._count += bool(np.isnan(self._times[rank]))
        self._times[rank] = now

    def forget(self, rank: int) -> None:
        """`rank` left: it has no clock (so the count of clocks is the members')."""
        if 0 <= rank < len(self._times) and not np.isnan(self._times[rank]):
            self._times[rank], self._count = np.nan, self._count - 1

    def start(self, ranks: Iterable[int], now: float) -> None:
        """Ranks without a clock get one that starts at `now`."""
        for rank in ranks:
            if rank >= len(self._times) or np.isnan(self._times[rank]):
                self.touch(rank, now)

    def silent(self, now: float, timeout: float, exclude: int | None = None) -> list[int]:
        """Ranks (but `exclude`) whose clock is at least `timeout` before `now`."""
        with np.errstate(invalid="ignore"):  # no clock (NaN) compares False
            ranks = np.flatnonzero(now - self._times >= timeout).tolist()
        return [r for r in ranks if r != exclude]

    def to_list(self) -> list[list]:
        """`[rank, time]` pairs by rank, JSON-safe."""
        ranks = np.flatnonzero(~np.isnan(self._times))
        return [[r, t] for r, t in zip(ranks.tolist(), self._times[ranks].tolist())]


__all__ = ["RankClocks"]
