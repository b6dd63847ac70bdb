"""The CPU time a process's cgroup may use: `cpu.max` (cgroup v2) or `cpu.cfs_quota_us`
over `cpu.cfs_period_us` (v1), the lowest along its cgroup and every parent.

A container limited by a CPU quota (Docker `--cpus`, a Kubernetes CPU limit, systemd's
`CPUQuota=`, a batch scheduler's job) still sees every core of its host in its affinity,
so threads sized by the affinity alone would outnumber the CPU time it gets: a driver that
reads with eight threads on two CPUs' worth of quota starves its own training loop. Ray
sizes its workers by the same files; rayshard reads them for a process Ray did not start.
The process's cgroup comes from `/proc/self/cgroup` (inside a cgroup namespace it is the
mount's root). Pure: the paths are arguments.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePosixPath

ROOT = Path("/sys/fs/cgroup")
MEMBERSHIP = Path("/proc/self/cgroup")


def cpu_quota(root: Path = ROOT, membership: Path = MEMBERSHIP) -> float | None:
    """The CPUs' worth of time allowed (1.5: one and a half), or None where no cgroup on
    the way sets a quota or its files cannot be read (then the affinity alone counts)."""
    v2, v1 = _own_cgroups(membership)
    quotas = [q for folder in _upwards(root, v2) if (q := _v2_quota(folder)) is not None]
    if not quotas:
        quotas = [q for folder in _upwards(root / "cpu", v1) if (q := _v1_quota(folder))]
    return min(quotas) if quotas else None


def _own_cgroups(membership: Path) -> tuple[str, str]:
    """The process's v2 cgroup path and its v1 `cpu` controller's ("/" if unknown)."""
    v2 = v1 = "/"
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return v2, v1
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    return v2, v1


def _upwards(base: Path, path: str) -> Iterator[Path]:
    """`base / path`, then each parent up to `base` itself."""
    parts = PurePosixPath(path).parts[1:]
    for depth in range(len(parts), -1, -1):
        yield base.joinpath(*parts[:depth])


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()
        return None if quota == "max" else _positive(float(quota) / float(period))
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = float((folder / "cpu.cfs_quota_us").read_text())
        period = float((folder / "cpu.cfs_period_us").read_text())
        return None if quota < 0 else _positive(quota / period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _positive(cpus: float) -> float | None:
    return cpus if cpus > 0 else None


__all__ = ["MEMBERSHIP", "ROOT", "cpu_quota"]
