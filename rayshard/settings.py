"""The loader's own settings beyond the planner's: policy, reading, prefetching."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from rayshard.errors import ConfigError
from rayshard.plan import PlanConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoaderSettings:
    """Everything a loader's actors need to know, validated on the driver."""

    plan: PlanConfig
    policy: str = "data"
    columns: tuple[str, ...] | None = None
    shuffle: bool = False
    prefetch_depth: int = 2
    model_parallel_size: int = 1
    dp_groups: tuple[tuple[int, ...], ...] | None = None
    state_timeout_s: float = 60.0
    reader_num_cpus: float = 0.0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(
                f"policy={self.policy!r} is not a valid choice: use one of {', '.join(POLICIES)}"
            )
        if isinstance(self.prefetch_depth, bool) or not isinstance(self.prefetch_depth, int):
            raise ConfigError(f"prefetch_depth={self.prefetch_depth!r} must be an integer >= 1")
        if self.prefetch_depth < 1:
            raise ConfigError(
                f"prefetch_depth={self.prefetch_depth} is not in the range prefetch_depth>=1"
            )
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))

    def fingerprint(self, source_name: str, num_samples: int) -> str:
        """A short id of (settings, source) that a saved state must match."""
        payload = json.dumps(
            {
                "plan": self.plan.to_dict(),
                "policy": self.policy,
                "columns": self.columns,
                "shuffle": self.shuffle,
                "source": source_name,
                "num_samples": num_samples,
            },
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


POLICIES = ("data", "file", "file_or_data", "off")


def by_files_for(policy: str, num_files: int, dp_size: int) -> bool:
    """Whether a policy splits whole files for this world (SPEC 6)."""
    if policy == "file":
        return True
    if policy == "file_or_data":
        return num_files >= dp_size
    return False


def as_tuple_groups(groups: Sequence[Sequence[int]] | None) -> Any:
    return None if groups is None else tuple(tuple(int(r) for r in g) for g in groups)
