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

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (a journal snapshot holds it)."""
        return {
            "generation": self.generation,
            "dp_size": self.dp_size,
            "world_size": self.world_size,
            "ranks": sorted(self.ranks),
            "world": [[w, d] for w, d in sorted(self.world.items())],
            "readers": [[d, n] for d, n in sorted(self.readers.items())],
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
        )


__all__ = ["Membership"]
