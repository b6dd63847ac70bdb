"""The named choices of the planner and its frozen configuration.

Resolution order for every option: explicit argument, then configuration file, then the
environment (`rayshard.config.env`), then the default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar

from rayshard.config.checks import check_int
from rayshard.config.env import parse_bool, plan_overrides
from rayshard.errors import ConfigError


class Rotation(str, Enum):
    """Which shard a rank reads in an epoch."""

    NONE = "none"
    SHIFT = "shift"
    STRIDE = "stride"
    STRIDE_SHIFT = "stride_shift"


class Uneven(str, Enum):
    """What file-level modes do when the files do not split evenly."""

    REPLICATE = "replicate"
    UNBALANCED = "unbalanced"
    DROP = "drop"


class LastBatch(str, Enum):
    """What happens to the last, short batch of a shard."""

    PARTIAL = "partial"
    DROP = "drop"
    FILL = "fill"


E = TypeVar("E", bound=Enum)


def parse_choice(enum_cls: type[E], value: Any, name: str) -> E:
    """Turn a string (or member) into an enum member; the error lists the options."""
    if isinstance(value, enum_cls):
        return value
    text = str(value).strip().lower()
    for member in enum_cls:
        if member.value == text:
            return member
    options = ", ".join(m.value for m in enum_cls)
    raise ConfigError(f"{name}={value!r} is not a valid choice: use one of {options}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """Everything the planner needs besides the data layout and the world.

    `total_shards=None` means one shard per data-parallel rank.
    """

    batch_size: int = 1
    total_shards: int | None = None
    rotation: Rotation = Rotation.SHIFT
    uneven: Uneven = Uneven.UNBALANCED
    last_batch: LastBatch = LastBatch.PARTIAL
    pad_last_batch: bool = False
    equal_steps: bool = True
    seed: int = 0
    expected_world_size: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "rotation", parse_choice(Rotation, self.rotation, "rotation"))
        set_(self, "uneven", parse_choice(Uneven, self.uneven, "uneven"))
        set_(self, "last_batch", parse_choice(LastBatch, self.last_batch, "last_batch"))
        set_(self, "pad_last_batch", parse_bool(self.pad_last_batch, "pad_last_batch"))
        set_(self, "equal_steps", parse_bool(self.equal_steps, "equal_steps"))
        check_int(self.batch_size, "batch_size", minimum=1, fix="use a batch size of 1 or more")
        if self.total_shards is not None:
            check_int(self.total_shards, "total_shards", minimum=1, fix="or leave it unset")
        if self.expected_world_size is not None:
            check_int(self.expected_world_size, "expected_world_size", minimum=1, fix="")
        check_int(self.seed, "seed", minimum=0, fix="use a non-negative integer seed")

    @classmethod
    def resolve(
        cls,
        explicit: Mapping[str, Any] | None = None,
        file: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> PlanConfig:
        """Merge explicit arguments over a configuration file over the environment.

        `None` values in `explicit` count as "not given". Unknown keys are an error.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        merged: dict[str, Any] = dict(plan_overrides(environ))
        for source_name, source in (("configuration file", file), ("arguments", explicit)):
            for key, value in (source or {}).items():
                if key not in known:
                    raise ConfigError(
                        f"unknown planner option {key!r} in {source_name}: "
                        f"known options are {', '.join(sorted(known))}"
                    )
                if value is not None:
                    merged[key] = value
        return cls(**merged)

    def shards_for(self, world_size: int) -> int:
        """The effective number of shards S for a data-parallel world of `world_size`."""
        return self.total_shards if self.total_shards is not None else world_size

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view (enums as their strings)."""
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, Enum):
                out[key] = value.value
        return out
