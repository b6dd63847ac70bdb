"""The members of one generation of a loader: data-parallel ranks and their readers."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Membership:
    """The ranks of one generation and their readers."""

    generation: int
    dp_size: int
    world_size: int
    ranks: set[int] = dataclasses.field(default_factory=set)  # registered dp ranks
    world: dict[int, int] = dataclasses.field(default_factory=dict)  # world rank -> dp rank
    readers: dict[int, str] = dataclasses.field(default_factory=dict)  # dp rank -> actor name
    # dp rank -> the shared watch actor that watches it under its reader name (a rank that
    # reads in its consumer: `rayshard.runtime.watch`); other ranks' readers watch themselves
    watches: dict[int, str] = dataclasses.field(default_factory=dict)
    # world rank -> the reader name it was given: a member registering again under the
    # group's current reader is a replaced worker; one given an older name is not
    given: dict[int, str] = dataclasses.field(default_factory=dict)
    # dp rank -> the data-parallel size its last registration gave (its world's view)
    sizes: dict[int, int] = dataclasses.field(default_factory=dict)
    # a group member's key -> (its dp rank, what watches its process), while it reads
    # (`rayshard.runtime.member_watch`): a restarted coordinator watches them again
    member_watches: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)

    def shared_watch(self, dp_rank: int, name: str) -> str | None:
        """The shared watch actor that watches reader `name` of `dp_rank` under that
        name, or None: the reader is an actor of its own and watches itself."""
        return self.watches.get(dp_rank) if self.readers.get(dp_rank) == name else None

    def attach(self, dp_rank: int, name: str, watch: str, member: bool) -> None:
        """Reader `name` of `dp_rank` attached (its rank's first one counts), watched by
        `watch` if shared; or (`member`) a group member's key `name`, watched by `watch`."""
        if member:
            self.member_watches[name] = (dp_rank, watch)
            return
        attached = self.readers.setdefault(dp_rank, name)
        if watch and attached == name:
            self.watches.setdefault(dp_rank, watch)

    def drop(self, dp_rank: int) -> None:
        """`dp_rank` is lost: its reader, watches and its members' watches go."""
        self.ranks.discard(dp_rank)
        for store in (self.readers, self.watches, self.sizes):
            store.pop(dp_rank, None)
        for key in [k for k, (d, _) in self.member_watches.items() if d == dp_rank]:
            del self.member_watches[key]

    def registers_again(self, world_rank: int, dp_rank: int) -> bool:
        """Whether a registration is the same worker again (a restarted worker, a new
        iterator): the old one is gone, even if its reader's death was not noticed yet. A
        member given an older reader name than its group's current one is not: it joins
        the replacement another member of its group made, rather than replacing it too."""
        reader = self.readers.get(dp_rank)
        return (
            self.world.get(world_rank) == dp_rank
            and dp_rank in self.ranks
            and self.given.get(world_rank, reader) == reader
        )

    def shrunk_to(self, dp_size: int) -> bool:
        """Whether a registration for `dp_size` ranks comes from a smaller world after every
        rank beyond it left (a Train group that shrank): `dynamic` books must then not keep
        shares for ranks that will not come back."""
        return dp_size < self.dp_size and max(self.ranks, default=-1) < dp_size

    def live_size(self) -> int:
        """The data-parallel size the living ranks registered for: smaller than `dp_size`
        once the ranks of a larger world left and every rank still here came from a smaller
        one (a group that shrank while the old ranks were still alive, then died); else
        `dp_size`. `dynamic` sizes each new epoch's book by it."""
        if not self.ranks:
            return self.dp_size
        live = max(self.sizes.get(r, self.dp_size) for r in self.ranks)
        return live if max(self.ranks) < live < self.dp_size else self.dp_size

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (a journal snapshot holds it)."""
        return {
            "generation": self.generation,
            "dp_size": self.dp_size,
            "world_size": self.world_size,
            "ranks": sorted(self.ranks),
            "world": [[w, d] for w, d in sorted(self.world.items())],
            "readers": [[d, n] for d, n in sorted(self.readers.items())],
            "watches": [[d, n] for d, n in sorted(self.watches.items())],
            "given": [[w, n] for w, n in sorted(self.given.items())],
            "sizes": [[d, n] for d, n in sorted(self.sizes.items())],
            "member_watches": [[k, d, w] for k, (d, w) in sorted(self.member_watches.items())],
        }

    @classmethod
    def from_dict(cls, m: dict[str, Any]) -> Membership:
        return cls(
            m["generation"],
            m["dp_size"],
            m["world_size"],
            set(m["ranks"]),
            {w: d for w, d in m["world"]},
            {d: n for d, n in m["readers"]},
            {d: n for d, n in m.get("watches", ())},  # journals from before shared watches
            {w: n for w, n in m.get("given", ())},  # and from before given names
            {d: n for d, n in m.get("sizes", ())},  # and before registered sizes
            {k: (d, w) for k, d, w in m.get("member_watches", ())},  # and before member watches
        )


__all__ = ["Membership"]
