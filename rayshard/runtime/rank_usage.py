"""Per-rank totals the coordinator keeps for `loader.stats()`: what each rank's consumers
received (from their acknowledgements) and, under `dynamic`, how its reading leased work.

Not journaled: they describe this coordinator process's service, so a restarted
coordinator counts again from zero (its lease book, which is journaled, is exact).
A group is counted once: one its relay forwarded, then failed to answer, is sent again
straight (`rayshard.runtime.ack_relay`), so each sender numbers its groups. The numbers of
a rank's `SENDERS_HELD` senders heard from last are kept (an iterator per epoch is a
sender per epoch: all of them would grow without end); a group of an older one counts
again.
"""

from __future__ import annotations

from typing import Any

from rayshard.core import commands as cmd

CONSUMER_KEYS = ("batches", "samples", "bytes", "stall_s")
LEASE_KEYS = ("calls", "paced", "rows", "waited_s")
GROUPS_HELD = 64  # a sender's group numbers held past a gap (`_Numbers`)
SENDERS_HELD = 64  # senders of one rank whose group numbers are kept (a group's members)


class RankUsage:
    """Totals by data-parallel rank (see module docstring)."""

    def __init__(self) -> None:
        self._consumers: dict[int, dict[str, Any]] = {}
        self._leases: dict[int, dict[str, Any]] = {}
        # rank -> sender -> numbers of its groups counted (least recently heard from first)
        self._counted: dict[int, dict[str, _Numbers]] = {}

    def acked(self, dp_rank: int, usage: dict | None) -> None:
        """A rank's consumers acknowledged batches: `usage` holds their real samples, bytes
        and the consumer's stall seconds, and `group` ("<sender>:<n>", numbered by its
        sender; absent: counted whatever it is): a group counted already is not again."""
        totals = self._consumers.setdefault(dp_rank, _zeros(CONSUMER_KEYS))
        usage = dict(usage or {})
        sender, _, number = str(usage.pop("group", "")).rpartition(":")
        if sender and not self._numbers(dp_rank, sender).add(int(number)):
            return
        for key, value in usage.items():
            totals[key] = totals.get(key, 0) + value

    def _numbers(self, dp_rank: int, sender: str) -> _Numbers:
        senders = self._counted.setdefault(dp_rank, {})
        numbers = senders.pop(sender, None) or _Numbers()
        senders[sender] = numbers  # (heard from last: at the end)
        if len(senders) > SENDERS_HELD:  # the sender heard from least recently goes
            del senders[next(iter(senders))]
        return numbers

    def leased(self, dp_rank: int, answer: Any, paced: bool, waited_s: float) -> None:
        """A lease call of `dp_rank` was answered with `answer` (a `cmd.Leased`; anything
        else, such as a refusal, is not counted); `paced`: the rank asked early, with rows
        in hand; `waited_s`: seconds its reading waited for lease answers since its last
        call (each call reports the waits before it)."""
        if not isinstance(answer, cmd.Leased):
            return
        totals = self._leases.setdefault(dp_rank, _zeros(LEASE_KEYS))
        totals["calls"] += 1
        totals["paced"] += int(paced)
        totals["rows"] += sum(end - start for start, end in answer.pieces)
        totals["waited_s"] += max(0.0, float(waited_s))

    def summary(self) -> dict[str, dict[int, dict]]:
        """`consumers` and `lease_calls`, by rank (copies)."""
        return {
            "consumers": {r: dict(t) for r, t in sorted(self._consumers.items())},
            "lease_calls": {r: dict(t) for r, t in sorted(self._leases.items())},
        }


class _Numbers:
    """The numbers of one sender's groups counted: all below `low` and those in `above`.
    Groups come nearly in order, so `above` holds the few past a gap; past `GROUPS_HELD`
    of them the gap counts as filled (a group that never came: its straight call failed,
    or it came before this coordinator restarted)."""

    def __init__(self) -> None:
        self.low, self.above = 0, set()

    def add(self, number: int) -> bool:
        """Whether group `number` is new (it is held from now on)."""
        if number < self.low or number in self.above:
            return False
        self.above.add(number)
        if len(self.above) > GROUPS_HELD:
            self.low = min(self.above)
        while self.low in self.above:
            self.above.discard(self.low)
            self.low += 1
        return True


def _zeros(keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: 0.0 if key.endswith("_s") else 0 for key in keys}


__all__ = ["RankUsage"]
