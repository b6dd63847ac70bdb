"""Local multi-node Ray for experiments (`ray.cluster_utils.Cluster`): a head node that
holds the driver, the coordinator and the recorder, and worker nodes that come and go.

Node deaths are detected through Ray's health checks; the experiment shortens them
(`health_check_period_ms`, `health_check_failure_threshold`) so a killed node is noticed
in about a second and a half instead of Ray's default.
"""

from __future__ import annotations

import os
from typing import Any

HEALTH_CHECK = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}


class LocalCluster:
    """Worker nodes in order of creation; `kill` removes one abruptly, `remove` too but
    after its rank has left."""

    def __init__(self, node_cpus: int) -> None:
        from ray.cluster_utils import Cluster

        self._cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": False,
                "_system_config": HEALTH_CHECK,
                "env_vars": {"PYTHONPATH": os.getcwd()},
            },
        )
        self._cpus = node_cpus
        self.nodes: list[Any] = []  # index -> node handle (None once gone)

    @property
    def address(self) -> str:
        return self._cluster.address

    def add(self) -> int:
        self.nodes.append(self._cluster.add_node(num_cpus=self._cpus))
        self._cluster.wait_for_nodes()
        return len(self.nodes) - 1

    def node_id(self, index: int) -> str:
        return self.nodes[index].node_id

    def alive(self) -> list[int]:
        return [i for i, node in enumerate(self.nodes) if node is not None]

    def remove(self, index: int) -> None:
        node, self.nodes[index] = self.nodes[index], None
        self._cluster.remove_node(node, allow_graceful=False)

    def shutdown(self) -> None:
        self._cluster.shutdown()
