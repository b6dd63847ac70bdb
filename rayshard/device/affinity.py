"""Pin reader threads to CPUs with `RAYSHARD_AFFINITY_MASK` (DALI's `DALI_AFFINITY_MASK`).

The mask is a comma-separated list of CPU ids: reader thread i runs on the i-th id, and
threads beyond the list keep the default affinity (the CPUs the creating thread may use).
Pinning stops CPU-heavy decode threads hopping between cores. On Linux,
`os.sched_setaffinity(0, ...)` applies to the calling thread only, which is what makes
per-thread pinning possible from Python.
"""

from __future__ import annotations

import itertools
import os
import threading
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from rayshard.config.checks import check_int
from rayshard.device import env
from rayshard.errors import ConfigError

CAN_PIN = hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def allowed_cpus() -> frozenset[int]:
    """The CPUs the calling thread may run on (every CPU where affinity is not supported)."""
    if CAN_PIN:
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def parse_affinity_mask(
    text: str | None = None, allowed: Iterable[int] | None = None
) -> tuple[int, ...]:
    """Parse a mask such as `"3,5,6,10"` into CPU ids, checked against the allowed CPUs.

    `text=None` reads `RAYSHARD_AFFINITY_MASK`; an empty mask means no pinning. An id that
    is not an integer, or names a CPU this process may not use, is a `ConfigError`
    (a `ValueError`) naming the id. Ids may repeat: two threads may share a CPU.
    """
    source = env.AFFINITY_MASK if text is None else "affinity mask"
    text = env.affinity_mask_text() if text is None else text.strip()
    if not text:
        return ()
    permitted = allowed_cpus() if allowed is None else frozenset(allowed)
    cpus = []
    for item in text.split(","):
        item = item.strip()
        try:
            cpu = int(item)
        except ValueError:
            raise ConfigError(
                f"{source}={text!r}: {item!r} is not a CPU id; give comma-separated "
                f"integers such as '0,2,3'"
            ) from None
        if cpu not in permitted:
            raise ConfigError(
                f"{source}={text!r} names CPU {cpu}, which this process may not run on "
                f"(allowed: {_ranges(permitted)}); drop it or pick one of the allowed CPUs"
            )
        cpus.append(cpu)
    return tuple(cpus)


def cpus_for_thread(
    index: int, mask: Sequence[int], default: Iterable[int] | None = None
) -> frozenset[int]:
    """The CPU set for reader thread `index`: `{mask[index]}`, or `default` past the list."""
    check_int(index, "index", minimum=0, error=ValueError, fix="a reader thread's index")
    if index < len(mask):
        return frozenset({mask[index]})
    return allowed_cpus() if default is None else frozenset(default)


def pin_current_thread(cpus: Iterable[int]) -> bool:
    """Restrict the calling thread to `cpus`; returns False (and warns once) without support."""
    cpus = frozenset(cpus)
    if not cpus:
        raise ValueError("cpus is empty: a thread needs at least one CPU to run on")
    if not CAN_PIN:
        _warn_unsupported()
        return False
    os.sched_setaffinity(0, cpus)
    return True


def reader_pool(
    num_threads: int,
    mask: Sequence[int] | None = None,
    thread_name_prefix: str = "rayshard-reader",
) -> ThreadPoolExecutor:
    """A thread pool whose worker i is pinned by `mask` (default: `RAYSHARD_AFFINITY_MASK`).

    Workers name themselves `f"{thread_name_prefix}-{i}"` in start order. Threads past the
    end of the mask get the affinity of the thread that created the pool, so they do not
    inherit a pin from whichever pinned thread happened to submit work.
    """
    check_int(num_threads, "num_threads", minimum=1)
    mask = parse_affinity_mask() if mask is None else tuple(mask)
    if len(mask) > num_threads:
        warnings.warn(
            f"affinity mask lists {len(mask)} CPUs but num_threads={num_threads}: "
            f"the last {len(mask) - num_threads} ids are unused",
            RuntimeWarning,
            stacklevel=2,
        )
    default = allowed_cpus()
    counter = itertools.count()
    lock = threading.Lock()

    def pin_by_index() -> None:
        with lock:
            index = next(counter)
        threading.current_thread().name = f"{thread_name_prefix}-{index}"
        if mask:
            pin_current_thread(cpus_for_thread(index, mask, default))

    return ThreadPoolExecutor(
        max_workers=num_threads,
        thread_name_prefix=thread_name_prefix,
        initializer=pin_by_index,
    )


def _ranges(cpus: Iterable[int]) -> str:
    """`{0,1,2,5}` -> `"0-2,5"` for short error messages."""
    ordered = sorted(cpus)
    parts = []
    for _, run in itertools.groupby(enumerate(ordered), key=lambda pair: pair[1] - pair[0]):
        ids = [cpu for _, cpu in run]
        parts.append(str(ids[0]) if len(ids) == 1 else f"{ids[0]}-{ids[-1]}")
    return ",".join(parts)


_warned_unsupported = False


def _warn_unsupported() -> None:
    global _warned_unsupported
    if not _warned_unsupported:
        _warned_unsupported = True
        warnings.warn(
            "thread affinity is not supported on this platform (no os.sched_setaffinity): "
            "RAYSHARD_AFFINITY_MASK is ignored",
            RuntimeWarning,
            stacklevel=3,
        )
