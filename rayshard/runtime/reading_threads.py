"""How many threads read in a process when `reader_threads` is left to rayshard (None).

Ray sizes a worker's native thread pools to the CPUs it was given (`OMP_NUM_THREADS`,
which pyarrow's pool follows), and a Parquet row group of a few columns decodes on about
one thread whatever the pool: a rank that reserved 8 CPUs but reads one piece at a time
uses one of them. By default a rank reads as many pieces at once as the CPUs Ray assigned
to the task or actor that reads (1 when it asked for none); in a process Ray did not start
(a driver), as the CPUs the process may run on, or its container's CPU quota if fewer
(`rayshard.runtime.cpu_quota`: Ray sizes its workers so too); at most
`AUTO_READER_THREADS_MAX`. Set
`RAYSHARD_AFFINITY_MASK` and there is one reading thread per CPU id it names.
"""

from __future__ import annotations

import ray

from rayshard.device.affinity import allowed_cpus, parse_affinity_mask
from rayshard.runtime import cpu_quota

AUTO_READER_THREADS_MAX = 8


def reading_threads(configured: int | None) -> int:
    """`reader_threads` as configured, or (None) the number this process reads with."""
    if configured is not None:
        return configured
    mask = parse_affinity_mask()
    if mask:
        return threads_for_cpus(len(mask))
    return threads_for_cpus(_cpus_of_this_process())


def threads_for_cpus(cpus: float) -> int:
    """The default reading threads of a process with `cpus` CPUs (fractions round down)."""
    return max(1, min(AUTO_READER_THREADS_MAX, int(cpus)))


def _cpus_of_this_process() -> float:
    """The CPUs Ray assigned to this task or actor (fractions round down), or, outside a
    Ray worker, the CPUs this process may run on within its container's CPU quota."""
    if ray.is_initialized():
        try:
            assigned = ray.get_runtime_context().get_assigned_resources()
        except AssertionError:  # Ray answers only in its workers: this is a driver
            pass
        else:
            return assigned.get("CPU", 0)
    quota = cpu_quota.cpu_quota(cpu_quota.ROOT, cpu_quota.MEMBERSHIP)
    return min(len(allowed_cpus()), quota or float("inf"))


__all__ = ["AUTO_READER_THREADS_MAX", "reading_threads", "threads_for_cpus"]
