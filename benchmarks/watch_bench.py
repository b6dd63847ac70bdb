"""`python -m benchmarks.watch_bench`: what watching the ranks of another node costs.

A `ray.cluster_utils` cluster on this machine: a head (the driver and the loader's
coordinator) and one worker node with `--ranks` CPUs, where `--ranks` rank tasks each make
an iterator (reading in its own process, the default) and read one epoch of generated
Parquet. Two ways in the same run, each with fresh rank processes:

  node_watch   the ranks watched by pid through the node's one `NodeWatch` (the default)
  rank_watch   through a `RankWatch` actor per rank process (`RAYSHARD_WATCH_BY_PID=0`:
               what every worker on another node did before `NodeWatch`, and still does
               where pidfds are missing)

For each: the watch actors once every rank has its first batch and they have started
(count, and their processes' summed PSS, `benchmarks/_measure.py`); over the ranks
(median and slowest), how long `iterator()` takes and, after `--setup-s` (a model's
set-up), `iter()` to the first batch: a rank does not wait for its `RankWatch` to start;
the first reads of a node's first rank wait for its node's `NodeWatch`, which starts
during the set-up; and the epoch's coverage. Prints a table; writes
`benchmarks/results/watch_bench.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
from ray.cluster_utils import Cluster

from benchmarks._measure import (
    MB,
    format_table,
    process_name,
    process_tree,
    pss_bytes,
    wait_for_exit,
)
from benchmarks._report import ROOT, write_json
from benchmarks.loaders.data import COLUMNS, make_dataset, parquet_files

WAYS = {"node_watch": "1", "rank_watch": "0"}  # way -> RAYSHARD_WATCH_BY_PID in the ranks
WATCH_PROCESSES = ("ray::NodeWatch", "ray::RankWatch")  # their /proc names


class Gate:
    """The ranks wait here after their first batch, until the driver has measured."""

    def __init__(self) -> None:
        self.arrived = 0
        self.opened = asyncio.Event()

    async def arrive(self) -> None:
        self.arrived += 1
        await self.opened.wait()

    async def count(self) -> int:
        return self.arrived

    async def open(self) -> None:
        self.opened.set()


def read_rank(loader, rank: int, world: int, gate, setup_s: float) -> dict:
    """One rank: how long `iterator()` takes, then, after `setup_s` (a model's set-up),
    `iter()` to the first batch; then (past the gate) the epoch."""
    began = time.perf_counter()
    iterator = loader.iterator(world_rank=rank, world_size=world, batch_format="numpy")
    made_s = time.perf_counter() - began
    time.sleep(setup_s)
    began = time.perf_counter()
    batches = iter(iterator)
    first = next(batches)
    first_s = time.perf_counter() - began
    ray.get(gate.arrive.remote())
    ids = [first["id"][~first["_padded"]]]
    ids += [batch["id"][~batch["_padded"]] for batch in batches]
    return {"iterator_s": made_s, "first_batch_s": first_s, "ids": np.concatenate(ids)}


def watch_processes() -> dict[str, list[int]]:
    """PSS in bytes of every live watch process of this run (its cluster's nodes are this
    process's children), by name."""
    out: dict[str, list[int]] = {name: [] for name in WATCH_PROCESSES}
    for pid in process_tree():
        name = process_name(pid)
        if name in out:
            out[name].append(pss_bytes(pid).get("Pss", 0))
    return out


def watch_actors() -> dict[str, list[str]]:
    """States of the watch actors Ray has not ended, by class (`NodeWatch`, `RankWatch`)."""
    out: dict[str, list[str]] = {"NodeWatch": [], "RankWatch": []}
    for actor in ray._private.state.actors().values():
        kind = actor["ActorClassName"].rsplit(".", 1)[-1]
        if kind in out and actor["State"] != "DEAD":
            out[kind].append(actor["State"])
    return out


def wait_for_started_watches(timeout_s: float = 60.0) -> dict[str, list[str]]:
    """Until every watch actor is started (a rank does not wait for its `RankWatch` to
    start: its first batch may come first), so that their processes are measured."""
    deadline = time.time() + timeout_s
    while True:
        actors = watch_actors()
        states = [state for states in actors.values() for state in states]
        if all(state == "ALIVE" for state in states) or time.time() > deadline:
            return actors
        time.sleep(0.1)


def measure(way: str, paths: list[str], rows: int, ranks: int, setup_s: float) -> dict:
    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    wait_for_exit(WATCH_PROCESSES, timeout_s=60)  # the way before's: they would count
    loader = Loader(
        ParquetSource(paths, columns=COLUMNS),
        batch_size=1024,
        name=f"watch-{way}",
        columns=COLUMNS,
        shuffle=False,
    )
    try:
        gate = ray.remote(num_cpus=0)(Gate).options(resources={"head": 1}).remote()
        env = {"env_vars": {"RAYSHARD_WATCH_BY_PID": WAYS[way]}}
        task = ray.remote(num_cpus=1)(read_rank).options(resources={"n1": 1}, runtime_env=env)
        refs = [task.remote(loader, rank, ranks, gate, setup_s) for rank in range(ranks)]
        while ray.get(gate.count.remote()) < ranks:
            time.sleep(0.1)
        actors = wait_for_started_watches()
        processes = watch_processes()
        stats = loader.stats()
        ray.get(gate.open.remote())
        results = ray.get(refs)
    finally:
        loader.shutdown()
    ids = np.sort(np.concatenate([r["ids"] for r in results]))
    first = sorted(r["first_batch_s"] for r in results)
    made = sorted(r["iterator_s"] for r in results)
    return {
        "way": way,
        "ranks": ranks,
        "node_watches": len(actors["NodeWatch"]),
        "rank_watches": len(actors["RankWatch"]),
        "watch_processes": sum(len(p) for p in processes.values()),
        "watch_pss_mb": sum(sum(p) for p in processes.values()) / MB,
        "watched_by_pid": stats["watched_by_pid"],
        "setup_s": setup_s,
        "iterator_median_s": statistics.median(made),
        "iterator_max_s": made[-1],
        "first_batch_median_s": statistics.median(first),
        "first_batch_max_s": first[-1],
        "coverage_ok": bool(len(ids) == rows and np.array_equal(ids, np.arange(rows))),
    }


TABLE = [
    ("way", "way", "s"),
    ("ranks", "ranks", "d"),
    ("NodeWatch", "node_watches", "d"),
    ("RankWatch", "rank_watches", "d"),
    ("watch PSS MB", "watch_pss_mb", ",.1f"),
    ("by pid", "watched_by_pid", "d"),
    ("iterator() median s", "iterator_median_s", ".3f"),
    ("iterator() max s", "iterator_max_s", ".3f"),
    ("set-up s", "setup_s", ".1f"),
    ("iter() to 1st batch median s", "first_batch_median_s", ".3f"),
    ("iter() to 1st batch max s", "first_batch_max_s", ".3f"),
    ("coverage", "coverage", "s"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4, help="rank processes on the node")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument(
        "--setup-s", type=float, default=0.0, help="a rank's wait between iterator() and iter()"
    )
    parser.add_argument("--data", type=Path, help="folder for the generated Parquet")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/watch_bench.json")
    args = parser.parse_args(argv)
    folder = args.data or Path(tempfile.gettempdir()) / f"rayshard-watch-bench-{args.rows}"
    make_dataset(folder, args.rows)
    paths = parquet_files(folder)
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ["PYTHONPATH"] = str(ROOT)  # the nodes' workers import `benchmarks.*`
    head = {"num_cpus": 1, "resources": {"head": 100}, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        cluster.add_node(num_cpus=args.ranks, resources={"n1": 100})
        ray.init(address=cluster.address, log_to_driver=False, namespace="rayshard-watch-bench")
        cluster.wait_for_nodes()
        results = [measure(way, paths, args.rows, args.ranks, args.setup_s) for way in WAYS]
    finally:
        ray.shutdown()
        cluster.shutdown()
    rows = [{**r, "coverage": "ok" if r["coverage_ok"] else "FAILED"} for r in results]
    print(format_table(rows, TABLE))
    config = {"ranks": args.ranks, "rows": args.rows, "setup_s": args.setup_s}
    write_json(args.json, {"config": config, "results": results})
    return 0 if all(r["coverage_ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
