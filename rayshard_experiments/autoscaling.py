"""A local Ray cluster scaled by Ray's own (v1) autoscaler with the fake-multinode
provider: worker nodes are added when work is pending and removed when they sit idle.

`ray.cluster_utils.AutoscalingCluster` cannot be used as shipped in Ray 2.60: it reads a
fake-multinode `example.yaml` that the wheel does not contain, and its start and shutdown
run `ray stop --force`, which kills every Ray process on the machine. This module starts
the head itself instead:

    RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=<config> --temp-dir=<private>

with free ports and a private temporary folder, so other Ray instances on the machine are
never touched. The head's monitor process runs the autoscaler; its `fake_multinode`
provider starts and stops worker nodes (a raylet and its workers each) on this machine.

Scale-up is demand-driven: worker nodes carry a custom resource (`rayshard_worker: 1`) the
head lacks, so an actor that asks for it stays pending until the autoscaler adds a node.
Scale-down: a worker node whose resources have been unused for `idle_timeout_s` is
terminated by the autoscaler (the config's `idle_timeout_minutes`, in minutes, hence
`idle_timeout_s / 60`). `AUTOSCALER_UPDATE_INTERVAL_S` (an integer, seconds; Ray's default
is 5) sets how often the autoscaler looks: 1 here.

`shutdown()` stops only what this object started: every process in the process group of
the `ray start` it ran (the head's GCS, raylet, monitor and, through the monitor, the fake
nodes) and every process whose command line names its private temporary folder (the fake
nodes' raylets and workers). `leftovers()` lists any that remain.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

WORKER_RESOURCE = "rayshard_worker"
WORKER_TYPE = "rayshard.worker"
HEAD_TYPE = "ray.head.default"  # the fake provider names the head's type this way


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def autoscaling_config(
    *,
    worker_cpus: int,
    max_workers: int,
    idle_timeout_s: float,
    gcs_address: str,
    head_resources: dict[str, Any] | None = None,
) -> dict:
    """The cluster config the head's autoscaler reads (fake_multinode provider)."""
    return {
        "cluster_name": "rayshard-fake",
        "max_workers": max_workers,
        "upscaling_speed": float(max_workers),
        "idle_timeout_minutes": idle_timeout_s / 60.0,
        "provider": {
            "type": "fake_multinode",
            # Without it the provider starts nodes against <this ip>:6379, another Ray's
            # default port.
            "gcs_address": gcs_address,
            # Start every node a launch asks for (by default the provider starts one per
            # launch, whatever the count, and the rest wait for the next update).
            "launch_multiple": True,
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        },
        "available_node_types": {
            HEAD_TYPE: {
                "resources": head_resources or {},
                "node_config": {},
                "max_workers": 0,
            },
            WORKER_TYPE: {
                "resources": {"CPU": worker_cpus, WORKER_RESOURCE: 1},
                "node_config": {},
                "min_workers": 0,
                "max_workers": max_workers,
            },
        },
        "head_node_type": HEAD_TYPE,
        "auth": {"ssh_user": "ray"},
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


class FakeAutoscalingCluster:
    """A head started with the fake-multinode autoscaler; worker nodes come on demand.

    `address` is the GCS address to pass to `ray.init`; `worker_nodes()` (needs a
    connected driver) lists the alive worker nodes; `shutdown()` stops everything this
    object started and nothing else."""

    def __init__(
        self,
        *,
        worker_cpus: int = 1,
        max_workers: int = 4,
        idle_timeout_s: float = 5.0,
        head_cpus: int = 1,
        update_interval_s: int = 1,
        system_config: dict | None = None,
        env_vars: dict[str, str] | None = None,
        keep_logs: bool = False,
    ) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.max_workers = max_workers
        self._keep_logs = keep_logs
        # Short: Ray's unix sockets live under it (a path has at most 107 bytes).
        self.temp_dir = tempfile.mkdtemp(prefix="rsas-", dir="/tmp")
        self._pgid: int | None = None
        from ray._private.services import get_node_ip_address

        port = _free_port()
        self.address = f"{get_node_ip_address()}:{port}"
        config_path = os.path.join(self.temp_dir, "autoscaling.json")
        with open(config_path, "w") as handle:
            json.dump(
                autoscaling_config(
                    worker_cpus=worker_cpus,
                    max_workers=max_workers,
                    idle_timeout_s=idle_timeout_s,
                    gcs_address=self.address,
                ),
                handle,
            )
        ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"
        command = [
            ray_cli,
            "start",
            "--head",
            f"--port={port}",
            f"--dashboard-agent-listen-port={_free_port()}",
            f"--metrics-export-port={_free_port()}",
            f"--num-cpus={head_cpus}",
            "--include-dashboard=false",
            f"--dashboard-port={_free_port()}",  # the minimal dashboard head still binds one
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
            f"--autoscaling-config={config_path}",
        ]
        if system_config:
            command.append("--system-config=" + json.dumps(system_config, separators=(",", ":")))
        env = {
            **os.environ,
            **(env_vars or {}),
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": str(int(update_interval_s)),
            "RAY_USAGE_STATS_ENABLED": "0",
            # `ray start` would otherwise turn token authentication on for this cluster.
            "RAY_AUTH_MODE": "disabled",
        }
        env.pop("RAY_ADDRESS", None)
        self._log = open(os.path.join(self.temp_dir, "ray-start.log"), "w")  # noqa: SIM115
        # Its own process group: everything the head starts (and the fake nodes its
        # monitor starts) stays in it, and shutdown() signals only that group.
        proc = subprocess.Popen(
            command, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._pgid = proc.pid
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            self.shutdown()
            raise RuntimeError(
                f"`ray start --head` for the fake autoscaling cluster failed (exit {code}); "
                f"see {os.path.join(self.temp_dir, 'ray-start.log')}"
            )
        with open(os.path.join(self.temp_dir, "ray_current_cluster")) as handle:
            self.address = handle.read().strip() or self.address
        self.started_at = time.time()

    # -- observation (a driver must be connected) ------------------------------------
    @staticmethod
    def worker_nodes() -> dict[str, dict]:
        """Alive worker nodes (those with the worker resource), by node id."""
        import ray

        return {
            node["NodeID"]: node
            for node in ray.nodes()
            if node["Alive"] and WORKER_RESOURCE in node.get("Resources", {})
        }

    # -- cleanup ----------------------------------------------------------------------
    def _ours(self) -> list[int]:
        """Pids of processes this cluster started: its process group, and any process
        whose command line names the private temporary folder."""
        pids = []
        me = os.getpid()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            pid = int(entry)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
                pgid = os.getpgid(pid)
                with open(f"/proc/{pid}/stat") as handle:
                    state = handle.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state == "Z":
                continue
            if pgid == self._pgid or self.temp_dir in cmdline:
                pids.append(pid)
        return pids

    def leftovers(self) -> list[int]:
        """Processes this cluster started that are still running (empty after shutdown)."""
        return self._ours()

    def shutdown(self, grace_s: float = 5.0) -> None:
        """SIGTERM everything this cluster started, SIGKILL what is left after `grace_s`,
        then remove the private temporary folder (unless `keep_logs`)."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            pids = self._ours()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.time() + wait
            while time.time() < deadline and self._ours():
                time.sleep(0.2)
        if not self._log.closed:
            self._log.close()
        if not self._keep_logs:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
