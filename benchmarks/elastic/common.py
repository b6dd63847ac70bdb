"""Helpers shared by the sections of the elastic benchmark."""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Sequence

import numpy as np
from tqdm import tqdm

KILL_MODES = ("ray_kill", "sigkill")
FEATURES = 128
ROW_BYTES = FEATURES * 4 + 8 + 8


def progress(iterable, **options):
    return tqdm(iterable, disable=None, file=sys.stderr, leave=False, **options)


def median_max(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    real = [v for v in values if v is not None]
    return (statistics.median(real), max(real)) if real else (None, None)


def overlaps(lo: int, hi: int, ranges: Sequence[Sequence[int]]) -> bool:
    return any(lo < end and start < hi for start, end in ranges)


def in_ranges(ids: np.ndarray, ranges: Sequence[Sequence[int]]) -> np.ndarray:
    hit = np.zeros(ids.shape, dtype=bool)
    for start, end in ranges:
        hit |= (ids >= start) & (ids < end)
    return hit


def id_runs(ids: np.ndarray) -> list[list[int]]:
    """Sorted ids as [start, end) runs."""
    if ids.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(ids) != 1) + 1
    return [[int(part[0]), int(part[-1]) + 1] for part in np.split(ids, cuts)]


def pid_of(actor) -> int:
    return os.getpid()
