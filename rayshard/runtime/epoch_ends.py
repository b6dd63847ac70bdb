"""Which epochs every rank of the coordinator received in full: the acknowledgement that
ends an epoch compacts the journal and wakes the ranks waiting at its end, once."""

from __future__ import annotations

from rayshard.core.coordination import CoordinatorCore


class EpochEnds:
    """Epoch ends seen by one coordinator process, by (generation, epoch)."""

    def __init__(self) -> None:
        # (generation, epoch) -> ranks that received all of it (static policies)
        self._finished: dict[tuple[int, int], set[int]] = {}
        self._ended: set[tuple[int, int]] = set()  # kept for the epochs still in play only

    def ended(self, generation: int, epoch: int) -> bool:
        """Whether an acknowledgement ended `epoch` of `generation` already."""
        return (generation, epoch) in self._ended

    def acked(
        self, core: CoordinatorCore, generation: int, epoch: int, dp_rank: int, batches: int
    ) -> bool:
        """Whether this acknowledgement (recorded in `core`) ended the epoch, the first time
        only (cheap until near its end)."""
        key = (generation, epoch)
        if key in self._ended or not self._over(core, epoch, dp_rank, batches):
            return False
        self._ended = {k for k in self._ended if k[1] >= epoch - 1} | {key}
        self._finished.pop(key, None)
        return True

    def _over(self, core: CoordinatorCore, epoch: int, dp_rank: int, batches: int) -> bool:
        if core.dynamic:
            book = core.books.get(epoch)
            return book is not None and book.exhausted() and core.epoch_complete(epoch)
        if batches < core.total(epoch, dp_rank):
            return False
        # Read from the journaled counts when first seen and once it may be over: ranks
        # that received it all before this coordinator restarted acknowledge no more, and
        # a rank lost since (its new process counts from the first batch again) is out.
        key, ranks = (core.members.generation, epoch), core.members.ranks
        counts = core.received.get(epoch, {})
        if key not in self._finished:
            self._finished[key] = {r for r, n in counts.items() if n >= core.total(epoch, r)}
        finished = self._finished[key]
        finished.add(dp_rank)
        if len(finished) < len(ranks):
            return False
        finished = self._finished[key] = {
            r for r in ranks if counts.get(r, 0) >= core.total(epoch, r)
        }
        return len(finished) == len(ranks)


__all__ = ["EpochEnds"]
