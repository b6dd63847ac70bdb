"""The fake-multinode autoscaler mode of an experiment (`autoscaler: true`): ranks are
demanded, a `FakeAutoscalingCluster` of this machine adds and removes nodes for them."""

from __future__ import annotations

import time
from typing import Any

import ray
from tqdm import tqdm

from rayshard.runtime.ray_tuning import apply_ray_env_defaults
from rayshard_experiments.actors import Consumer
from rayshard_experiments.runner import ExperimentRun
from rayshard_experiments.schedule import Event, Schedule


class _AutoscalingRun(ExperimentRun):
    """Ranks are demanded, not placed: each consumer asks for the worker-only resource and
    starts once the autoscaler has added a node for it; a rank that leaves frees its node,
    which the autoscaler removes once idle. Node changes are observed through `ray.nodes()`."""

    def __init__(self, schedule: Schedule, out_dir: str) -> None:
        from rayshard_experiments.autoscaling import FakeAutoscalingCluster

        apply_ray_env_defaults()
        cluster = FakeAutoscalingCluster(
            worker_cpus=schedule.node_cpus,
            max_workers=schedule.max_workers,
            idle_timeout_s=schedule.idle_timeout_s,
        )
        try:
            super().__init__(schedule, out_dir, cluster.address)
        except BaseException:
            ray.shutdown()
            cluster.shutdown()
            raise
        self.cluster = cluster
        self.start = time.time()
        self.pending: dict[int, Any] = {}  # demand index -> ready ref, until started
        self.leaving: dict[int, tuple[Any, Any]] = {}  # demand index -> (actor, leave ref)
        self.demanded_at: dict[int, float] = {}
        self.started_at: dict[int, float] = {}
        self.released_at: dict[str, float] = {}  # node id -> when its rank left
        self.rank_node: dict[int, str] = {}  # demand index -> node id
        self.nodes: dict[str, int] = {}  # alive worker node id -> index in order seen
        self.seen = 0
        self.node_added_at: dict[str, float] = {}
        self.node_removed_at: dict[str, float] = {}

    def clock(self) -> float:
        return time.time() - self.start

    def demand_rank(self) -> int:
        from rayshard_experiments.autoscaling import WORKER_RESOURCE

        index, rank = len(self.demanded_at), self.next_rank
        self.next_rank += 1
        consumer = (
            ray.remote(Consumer)
            .options(num_cpus=0, max_concurrency=4, resources={WORKER_RESOURCE: 1})
            .remote(
                self.loader, rank, self.recorder, self.schedule.epochs, self.schedule.step_time_s
            )
        )
        self.consumers[index] = (rank, consumer)
        self.pending[index] = consumer.__ray_ready__.remote()
        self.demanded_at[index] = self.clock()
        self.recorder.event.remote("rank_demanded", rank=rank, node=index)
        return index

    def poll(self) -> None:
        """Start consumers whose node has come up, end those that have left; record
        nodes added and removed."""
        for index, (consumer, left) in list(self.leaving.items()):
            if ray.wait([left], timeout=0)[0]:
                del self.leaving[index]
                self._end(index, consumer)
        for index, ready in list(self.pending.items()):
            if not ray.wait([ready], timeout=0)[0]:
                continue
            del self.pending[index]
            rank, consumer = self.consumers[index]
            epochs = self.loader.stats()["rank_epoch"]
            others = [
                epochs[r] for i, (r, _) in self.consumers.items() if i != index and r in epochs
            ]
            consumer.run.remote(min(others, default=0))
            self.started_at[index] = self.clock()
            info = ray._private.state.actors(actor_id=consumer._actor_id.hex())
            self.rank_node[index] = info.get("Address", {}).get("NodeID", "")
            self.recorder.event.remote(
                "rank_started", rank=rank, node=index, node_id=self.rank_node[index]
            )
        alive = self.cluster.worker_nodes()
        for node_id in alive.keys() - self.nodes.keys():
            self.nodes[node_id] = self.seen
            self.seen += 1
            self.node_added_at[node_id] = self.clock()
            self.recorder.event.remote("node_added", node=self.nodes[node_id], node_id=node_id)
        for node_id in self.nodes.keys() - alive.keys():
            self.node_removed_at[node_id] = self.clock()
            self.recorder.event.remote(
                "node_removed", node=self.nodes.pop(node_id), node_id=node_id
            )

    def release(self, index: int, graceful: bool) -> int:
        """The rank leaves (gracefully, or it had finished) and its actor ends, which frees
        the node's worker resource. A graceful leave is awaited by `poll`, not here, so
        that the loop keeps observing the cluster."""
        rank, consumer = self.consumers.pop(index)
        if index in self.pending:
            del self.pending[index]  # never started: the demand is withdrawn
        elif graceful:
            self.leaving[index] = (consumer, consumer.leave.remote())
            return rank
        self._end(index, consumer)
        return rank

    def _end(self, index: int, consumer: Any) -> None:
        ray.kill(consumer)
        if index in self.rank_node:
            self.released_at[self.rank_node[index]] = self.clock()

    def apply(self, event: Event) -> bool:
        """Carry out `event`; False when it must wait: a rank leaves only once it started
        (its node then idles out), however long the autoscaler took to add that node."""
        if event.action == "add_node":
            index = self.demand_rank()
            self.recorder.event.remote("add_node", node=index, mode="demand")
            return True
        alive = [i for i in self.consumers if i not in self.pending] or list(self.consumers)
        index = event.node if event.node is not None else (alive[0] if alive else None)
        if index is None or index not in self.consumers:
            self.recorder.event.remote(
                "skipped", action=event.action, node=index, reason="no such rank"
            )
            return True
        if index in self.pending:
            return False
        rank = self.release(index, graceful=True)
        self.recorder.event.remote(event.action, node=index, rank=rank, mode="rank_leaves")
        return True

    def awaiting_scale_down(self) -> list[str]:
        """Nodes whose rank left during the run and that the autoscaler has not removed
        yet: the run keeps observing (its other ranks held) until they are gone."""
        return [
            node
            for index, node in self.rank_node.items()
            if node in self.released_at and node in self.nodes and index not in self.consumers
        ]

    def timings(self) -> dict:
        """Scale-up: a rank's demand to its start (and to the first node added after it);
        scale-down: a node's rank leaving to the node's removal."""
        up = [round(self.started_at[i] - self.demanded_at[i], 3) for i in sorted(self.started_at)]
        down = [
            round(self.node_removed_at[n] - self.released_at[n], 3)
            for n in self.node_removed_at
            if n in self.released_at
        ]
        return {
            "max_workers": self.schedule.max_workers,
            "idle_timeout_s": self.schedule.idle_timeout_s,
            "nodes_added": len(self.node_added_at),
            "nodes_removed": len(self.node_removed_at),
            "scale_up_s": up,
            "scale_down_s": sorted(down),
            "workers_left": len(self.nodes),
            "temp_dir": self.cluster.temp_dir,
        }


def run_autoscaling_experiment(
    schedule: Schedule, out_dir: str, *, address: str | None = None, progress: bool = True
) -> dict:
    """`run_experiment` for `autoscaler: true`: a `FakeAutoscalingCluster` of this machine
    scales with the ranks' demand; after the ranks finish, waits (up to the idle timeout
    plus a minute) for the autoscaler to remove the idle nodes."""
    from rayshard.errors import ConfigError

    if address is not None:
        raise ConfigError("autoscaler: true starts its own local cluster; drop --address")
    run = _AutoscalingRun(schedule, out_dir)
    try:
        ray.get(run.recorder.mark_start.remote(run.start))
        for _ in range(schedule.initial_nodes):
            run.demand_rank()
        pending = list(schedule.events)
        bar = tqdm(
            total=int(schedule.duration_s),
            desc="experiment",
            unit="s",
            disable=None if progress else True,
        )
        while run.clock() < schedule.duration_s:
            while pending and pending[0].at <= run.clock() and run.apply(pending[0]):
                pending.pop(0)
            run.poll()
            idle_nodes_left = run.leaving or run.awaiting_scale_down()
            if not pending and not run.pending and not idle_nodes_left and run.finished():
                break
            if ray.get(run.recorder.failures.remote()):
                break  # (a rank that failed never finishes: the run stops, its error shown)
            time.sleep(0.25)
            bar.update(int(run.clock()) - bar.n)
        bar.close()
        elapsed = run.clock()
        completed = run.finished()
        not_scaled_down = run.awaiting_scale_down()
        # Idle scale-down: the finished ranks end, their nodes sit idle, the autoscaler
        # removes them. Every node whose rank left during the run is gone by now (or the
        # run ran out of `duration_s`, reported as `not_scaled_down`).
        run.recorder.event.remote("ranks_released", ranks=len(run.consumers))
        for index in list(run.consumers):
            run.release(index, graceful=False)
        deadline = time.time() + schedule.idle_timeout_s + 60
        while (run.nodes or run.leaving) and time.time() < deadline:
            run.poll()
            time.sleep(0.25)
        summary = ray.get(run.recorder.summary.remote())
        stats = run.loader.stats()
        run.loader.shutdown()
        return {
            "elapsed_s": round(elapsed, 3),
            "completed": completed,
            "health_check": None,
            **summary,
            "loader_events": stats["events"],
            "reserved_samples": stats["reserved_samples"],
            "autoscaling": {**run.timings(), "not_scaled_down_in_run": not_scaled_down},
        }
    finally:
        ray.shutdown()
        run.cluster.shutdown()
        left = run.cluster.leftovers()
        if left:
            raise RuntimeError(f"processes of the fake autoscaling cluster left: {left}")
