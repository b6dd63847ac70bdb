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

    def shared_watch(self, dp_rank: int, name: str) -> str | None:
        """The shared watch actor that watches reader `name` of `dp_rank` under that
        name, or None: the reader is an actor of its own and watches itself."""
        return self.watches.get(dp_rank) if self.readers.get(dp_rank) == name else None

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
        )


__all__ = ["Membership"]
