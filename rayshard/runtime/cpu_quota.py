"""The CPU time a container may use, from its cgroup: `cpu.max` (cgroup v2) or
`cpu.cfs_quota_us` over `cpu.cfs_period_us` (v1).

A container limited by a CPU quota (Docker `--cpus`, a Kubernetes CPU limit) still sees
every core of its host in its affinity, so threads sized by the affinity alone would
outnumber the CPU time it gets: a driver that reads with eight threads on two CPUs' worth
of quota starves its own training loop. Ray sizes its workers by the same files; rayshard
reads them for a process Ray did not start. Pure: the paths are arguments.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1 = (
    Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
    Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
)


def cpu_quota(v2: Path = CGROUP_V2, v1: tuple[Path, Path] = CGROUP_V1) -> float | None:
    """The CPUs' worth of time the cgroup allows (1.5: one and a half), or None when it sets
    no quota, or its files are missing or unreadable (then the affinity alone counts)."""
    try:
        if v2.exists():
            quota, period = v2.read_text().split()
            return None if quota == "max" else _positive(float(quota) / float(period))
        quota_file, period_file = v1
        if quota_file.exists() and period_file.exists():
            quota = float(quota_file.read_text())
            return None if quota < 0 else _positive(quota / float(period_file.read_text()))
    except (OSError, ValueError, ZeroDivisionError):
        return None
    return None


def _positive(cpus: float) -> float | None:
    return cpus if cpus > 0 else None


__all__ = ["CGROUP_V1", "CGROUP_V2", "cpu_quota"]
