"""What the planner knows about a dataset: how many samples, and per-file row counts."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence

from rayshard.config.checks import check_int
from rayshard.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DataLayout:
    """Sample count, and for file-based sources the rows of every file in dataset order.

    Sample `i` of the dataset is row `i - offsets[f]` of the file `f` whose
    `[offsets[f], offsets[f+1])` holds it.
    """

    num_samples: int
    file_rows: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_int(self.num_samples, "num_samples", minimum=0, integral=True)
        if self.file_rows is not None:
            object.__setattr__(self, "file_rows", tuple(int(r) for r in self.file_rows))
            if any(r < 0 for r in self.file_rows):
                raise ConfigError(f"file_rows={self.file_rows} holds a negative row count")
            if sum(self.file_rows) != self.num_samples:
                raise ConfigError(
                    f"file_rows add up to {sum(self.file_rows)}, not num_samples={self.num_samples}"
                )

    @classmethod
    def of_samples(cls, num_samples: int) -> DataLayout:
        return cls(num_samples=num_samples)

    @classmethod
    def of_files(cls, file_rows: Sequence[int]) -> DataLayout:
        rows = tuple(int(r) for r in file_rows)
        return cls(num_samples=sum(rows), file_rows=rows)

    @property
    def num_files(self) -> int:
        return len(self.file_rows) if self.file_rows is not None else 0

    @functools.cached_property
    def offsets(self) -> tuple[int, ...]:
        """`F + 1` cumulative row offsets; file `f` holds samples `[offsets[f], offsets[f+1])`.
        Computed once: a file source's every read looks a file up in them."""
        return (0, *itertools.accumulate(self.file_rows or ()))

    def __getstate__(self) -> dict:
        # The fields only: the cached offsets are rebuilt where they are used.
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
