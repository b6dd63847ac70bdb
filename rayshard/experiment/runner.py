"""Run an elastic experiment: a dynamic loader, one consumer rank per worker node, and the
schedule's node changes; returns everything the report needs."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tqdm import tqdm

from rayshard.experiment.actors import Consumer, Recorder
from rayshard.experiment.cluster import HEALTH_CHECK, LocalCluster
from rayshard.experiment.schedule import Event, Schedule
from rayshard.loader import Loader
from rayshard.ray_tuning import apply_ray_env_defaults
from rayshard.sources.parquet import ParquetSource


def make_data(folder: str, rows: int, batch_size: int, seed: int = 0) -> str:
    """A Parquet dataset of `rows` samples (an id and a 32-float feature), 4 files."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    bounds = np.linspace(0, rows, 5).astype(int)
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        x = rng.normal(size=(hi - lo) * 32).astype(np.float32)
        table = pa.table(
            {"id": np.arange(lo, hi), "x": pa.FixedSizeListArray.from_arrays(pa.array(x), 32)}
        )
        pq.write_table(
            table,
            os.path.join(folder, f"part-{index}.parquet"),
            row_group_size=max(batch_size * 2, 64),
        )
    return folder


class _Run:
    """The state of one experiment run (ranks, consumers, cluster)."""

    def __init__(self, schedule: Schedule, out_dir: str, address: str | None) -> None:
        self.schedule = schedule
        apply_ray_env_defaults()  # inherited by the local nodes started below
        self.cluster = None if address else LocalCluster(schedule.node_cpus)
        ray.init(
            address=address or self.cluster.address,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}},
        )
        data = schedule.data or make_data(
            os.path.join(out_dir, "data"), schedule.rows, schedule.batch_size, schedule.seed
        )
        self.loader = Loader(
            ParquetSource(data),
            batch_size=schedule.batch_size,
            policy="dynamic",
            equal_steps=False,
            seed=schedule.seed,
            name=f"experiment-{os.getpid()}-{int(time.time())}",
        )
        head = ray.get_runtime_context().get_node_id()
        self.recorder = (
            ray.remote(Recorder)
            .options(
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)
            )
            .remote(self.loader.layout.num_samples)
        )
        self.consumers: dict[int, tuple[int, Any]] = {}  # node index -> (rank, actor)
        self.next_rank = 0
        self.node_ids: dict[int, str] = {}

    def start_consumer(self, node_index: int, node_id: str) -> None:
        rank, self.next_rank = self.next_rank, self.next_rank + 1
        epochs = self.loader.stats()["rank_epoch"]
        alive = [epochs[r] for r, _ in self.consumers.values() if r in epochs]
        consumer = (
            ray.remote(Consumer)
            .options(
                num_cpus=0,
                max_concurrency=4,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            .remote(
                self.loader, rank, self.recorder, self.schedule.epochs, self.schedule.step_time_s
            )
        )
        consumer.run.remote(min(alive, default=0))
        self.consumers[node_index] = (rank, consumer)
        self.node_ids[node_index] = node_id
        self.recorder.event.remote("rank_started", rank=rank, node=node_index)

    def apply(self, event: Event) -> None:
        if self.cluster is None:
            self.recorder.event.remote(
                "skipped", action=event.action, reason="an existing cluster scales itself"
            )
            return
        if event.action == "add_node":
            index = self.cluster.add()
            self.recorder.event.remote("add_node", node=index)
            self.start_consumer(index, self.cluster.node_id(index))
            return
        alive = self.cluster.alive()
        index = event.node if event.node is not None else (alive[0] if alive else None)
        if index is None or index not in alive:
            self.recorder.event.remote(
                "skipped", action=event.action, node=index, reason="no such node alive"
            )
            return
        rank, consumer = self.consumers.pop(index)
        if event.action == "remove_node":
            ray.get(consumer.leave.remote())
        self.recorder.event.remote(event.action, node=index, rank=rank)
        self.cluster.remove(index)

    def finished(self) -> bool:
        done = set(ray.get(self.recorder.summary.remote())["finished"])
        return bool(self.consumers) and all(r in done for r, _ in self.consumers.values())


def run_experiment(
    schedule: Schedule, out_dir: str, *, address: str | None = None, progress: bool = True
) -> dict:
    """Run `schedule` (locally on `ray.cluster_utils.Cluster`, or on the cluster at
    `address`) and return the recorder's summary, the loader's stats and the timeline."""
    os.makedirs(out_dir, exist_ok=True)
    if schedule.autoscaler:
        return run_autoscaling_experiment(schedule, out_dir, address=address, progress=progress)
    run = _Run(schedule, out_dir, address)
    try:
        if run.cluster is not None:
            for _ in range(schedule.initial_nodes):
                index = run.cluster.add()
                run.start_consumer(index, run.cluster.node_id(index))
        else:
            for index, node in enumerate(n for n in ray.nodes() if n["Alive"]):
                run.start_consumer(index, node["NodeID"])
        pending = list(schedule.events)
        start = time.time()
        ray.get(run.recorder.mark_start.remote(start))
        bar = tqdm(
            total=int(schedule.duration_s),
            desc="experiment",
            unit="s",
            disable=None if progress else True,
        )
        while time.time() - start < schedule.duration_s:
            now = time.time() - start
            while pending and pending[0].at <= now:
                run.apply(pending.pop(0))
            if not pending and run.finished():
                break
            time.sleep(0.25)
            bar.update(int(time.time() - start) - bar.n)
        bar.close()
        elapsed = time.time() - start
        summary = ray.get(run.recorder.summary.remote())
        stats = run.loader.stats()
        run.loader.shutdown()
        return {
            "elapsed_s": round(elapsed, 3),
            "completed": run.finished(),
            "health_check": HEALTH_CHECK if run.cluster else None,
            **summary,
            "loader_events": stats["events"],
            "reserved_samples": stats["reserved_samples"],
        }
    finally:
        ray.shutdown()
        if run.cluster is not None:
            run.cluster.shutdown()


# -- The fake-multinode autoscaler mode (`autoscaler: true`) ------------------------------


class _AutoscalingRun(_Run):
    """Ranks are demanded, not placed: each consumer asks for the worker-only resource and
    starts once the autoscaler has added a node for it; a rank that leaves frees its node,
    which the autoscaler removes once idle. Node changes are observed through `ray.nodes()`."""

    def __init__(self, schedule: Schedule, out_dir: str) -> None:
        from rayshard.experiment.autoscaling import FakeAutoscalingCluster

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
        from rayshard.experiment.autoscaling import WORKER_RESOURCE

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
