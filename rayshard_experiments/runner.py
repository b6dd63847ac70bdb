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

from rayshard.loader import Loader
from rayshard.runtime.ray_tuning import apply_ray_env_defaults, export_pythonpath
from rayshard.sources.parquet import ParquetSource
from rayshard_experiments.actors import Consumer, Recorder
from rayshard_experiments.cluster import HEALTH_CHECK, LocalCluster
from rayshard_experiments.schedule import Event, Schedule


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


class ExperimentRun:
    """The state of one experiment run (ranks, consumers, cluster)."""

    def __init__(self, schedule: Schedule, out_dir: str, address: str | None) -> None:
        self.schedule = schedule
        apply_ray_env_defaults()  # inherited by the local nodes started below
        if address is None:
            export_pythonpath(os.getcwd())  # so is this, by their workers
        self.cluster = None if address else LocalCluster(schedule.node_cpus)
        ray.init(
            address=address or self.cluster.address,
            include_dashboard=False,
            log_to_driver=False,
            # A cluster started elsewhere gets the path through a runtime env instead.
            runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}} if address else None,
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

    def target(self, event: Event) -> int | None:
        """The node index a `kill_node` or `remove_node` event takes on the local cluster
        (None: none alive)."""
        alive = self.cluster.alive()
        return event.node if event.node is not None else (alive[0] if alive else None)

    def due(self, event: Event, now: float) -> bool:
        """Whether `event` runs now: its time has come and, for an event that takes a
        node away, that node's rank has delivered a batch (so the loss always takes a rank
        that holds work, however slowly the ranks start)."""
        if event.at > now:
            return False
        if event.action == "add_node" or self.cluster is None:
            return True
        consumer = self.consumers.get(self.target(event))
        if consumer is None:
            return True  # apply() records it as skipped
        return consumer[0] in ray.get(self.recorder.delivered.remote())

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
        index = self.target(event)
        if index is None or index not in self.cluster.alive():
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
        from rayshard_experiments.autoscaling_run import run_autoscaling_experiment

        return run_autoscaling_experiment(schedule, out_dir, address=address, progress=progress)
    run = ExperimentRun(schedule, out_dir, address)
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
            while pending and run.due(pending[0], now):
                run.apply(pending.pop(0))
            if (not pending and run.finished()) or ray.get(run.recorder.failures.remote()):
                break  # (a rank that failed never finishes: the run stops, its error shown)
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
