"""Benchmark rayshard against the other ways to feed data-parallel ranks from Parquet.

    python -m benchmarks [--rows N] [--quick] [--loaders rayshard,raw,...] [--ranks 2]
                         [--json PATH]

One dataset (generated Parquet: `x` fixed_size_list<float32>[128], `label` int64, `id`
int64; 8 files) read with the same columns and batch size (1024) by 2 ranks (`--ranks`)
through:

  rayshard   `Loader(ParquetSource)`, one Ray task per rank, batch_format="numpy" (each
             rank reads in its consumer, the default)
  rayshard_cpus     the same with each rank's task asking Ray for cores // ranks CPUs
             (the machine's or Ray's CPUs, the fewer; like a Train worker's
             `resources_per_worker`): it reads with that many threads, the default
             `reader_threads` (`rayshard`'s tasks ask for none: 1 thread)
  rayshard_dynamic  the same under `policy="dynamic"` (leases from the coordinator)
  rayshard_actor    the same with `consumer_reads=False`: read in the reader actors,
             handed over in object-store blocks
  rayshard_train    `rayshard.train.iterator` inside a `TorchTrainer` (2 workers)
  ray_data   `read_parquet(...).streaming_split(2, equal=True)`, one Ray task per split
  ray_train  `TorchTrainer` (2 workers, datasets={"train": ds}), `get_dataset_shard`
  torch      `DataLoader` over a map-style Dataset of row-group slices, each of 2 spawned
             processes reads its contiguous half (a DistributedSampler-style split)
  raw        `pq.ParquetFile.iter_batches` in 2 spawned processes, each over its half of
             the row groups: the ceiling

Every loader's ranks start each epoch together, as a DDP loop's ranks do: a
`multiprocessing` barrier for raw and torch, a harness actor for the Ray loaders
(`on_ray.EpochBarrier`, left out of the memory figures). Ranks that ran free would keep
their start-up offsets, and an epoch's span would count them.

Each loader runs once to warm up (Ray workers, imports, page cache), then is measured
over `--epochs` epochs (default 4) with a fresh loader. The first measured epoch gives
the cold-loader time to first batch (iterator creation and reader start-up included);
rows/s, MB/s and the ratios are those of the warm epoch of median rows/s after it, the
warm time to first batch (`TTFB warm`) the median of the warm epochs' own (one epoch
lasts about a second here, on a shared machine). Steady rows/s leave out each epoch's
start: per rank, the rows after its first batch over the time from its first batch to its
last, summed over ranks (median warm epoch; `benchmarks/_measure.py`). `launch s` is from
the measured run's start (for the Train loaders, `fit()`) to the last rank's first batch.
Coverage is checked on every measured epoch.

Memory: peak PSS summed over the benchmark process and all its descendants, sampled
every 0.1 s, or less often when a sample is costly so that sampling takes at most 3% of
one core (`--memory-duty`, `benchmarks/_measure.py`): a sample of a Ray loader's tree
costs 20-100 ms here (the raw scan's about 10), and at the 20% of a core allowed before,
the sampler took about 5% of the Ray loaders' rows/s on 2 cores and little of the raw
scan's (its tree is three processes). Paced so, samples may be seconds apart, longer than
an epoch: so one more is taken at every epoch edge (between two epochs and after the
last) while all ranks wait at the barrier, outside the epochs' timed spans. Each epoch's
peak (`pss_by_epoch_mb`) is over its samples, those at its edges included;
`pss_samples_inside_by_epoch` counts the paced ones that fell inside its span (0: its
peak is its edges'). If an epoch has no sample at all (`pss_measured` false), the PSS
checks say "not measured". torch and raw run before Ray starts, so their tree is the
driver and its 2 child processes; each Ray loader runs on a freshly started local Ray, and
its tree is the driver plus everything that Ray runs (gcs_server, raylet, Ray's agents,
every worker process: idle pool workers, tasks, actors, Ray Data and Train actors).
`pss_rise_mb` (`PSS rise`) is the peak minus `idle_pss_mb`, the loader's fresh tree
before its warm-up (the driver alone for raw and torch; the driver and the just-started
Ray, settled, for the Ray loaders): the warm-up's workers, which the measured run reuses,
count in the rise as the raw scan's freshly spawned processes do. `PSS growth` is the
last epoch's peak minus the first warm one's; `pss_sampler_cpu_s` is the sampler's own
CPU time.
"""

from __future__ import annotations

import argparse
import functools
import gc
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from tqdm import tqdm

from benchmarks._cpu import TreeCpu, cpu_between
from benchmarks._measure import (
    MB,
    MEMORY_DUTY,
    PeakPss,
    epoch_windows,
    format_table,
    growth,
    peak_between,
    process_tree,
    samples_between,
    summarize_epoch,
    tree_pss,
    upper_median,
    wait_for_exit,
)
from benchmarks._report import ROOT, start_local_ray, write_json
from benchmarks.loaders import on_ray
from benchmarks.loaders.data import (
    BATCH_SIZE,
    COLUMNS,
    ROW_BYTES,
    WORLD,
    check_folder,
    make_dataset,
    parquet_files,
)
from benchmarks.loaders.local import run_raw, run_torch
from benchmarks.loaders.on_ray import (
    run_ray_data,
    run_ray_train,
    run_rayshard,
    run_rayshard_actor,
    run_rayshard_cpus,
    run_rayshard_dynamic,
    run_rayshard_train,
)

DEFAULT_JSON = ROOT / "benchmarks" / "results" / "loader_bench.json"
LOADERS = (
    "rayshard",
    "rayshard_cpus",
    "rayshard_dynamic",
    "rayshard_actor",
    "rayshard_train",
    "ray_data",
    "ray_train",
    "torch",
    "raw",
)
RAY_LOADERS = tuple(n for n in LOADERS if n not in ("torch", "raw"))
TARGETS = {
    "rows_vs_raw": 0.8,  # rayshard rows/s >= 0.8 x raw scan
    "rows_vs_ray_data": 4.0,  # rayshard rows/s >= 4 x Ray Data streaming_split
    "steady_vs_ray_data": 2.0,  # steady-state rows/s >= 2 x Ray Data's
    "time_to_first_batch_s": 0.5,  # on a warm Ray
    "pss_vs_raw": 1.5,  # peak PSS <= 1.5 x raw scan
}
# Other rayshard loaders: (loader, ratio key, target).
VARIANT_TARGETS = (
    ("rayshard_dynamic", "rows_vs_rayshard", 0.8),  # dynamic >= 0.8 x static
    ("rayshard_train", "rows_vs_raw", 0.7),  # inside Ray Train >= 0.7 x raw scan
    ("rayshard_train", "launch_to_first_batch_s", 3.0),  # TorchTrainer start to first batch
)


RUNNERS = {
    "rayshard": run_rayshard,
    "rayshard_cpus": run_rayshard_cpus,
    "rayshard_dynamic": run_rayshard_dynamic,
    "rayshard_actor": run_rayshard_actor,
    "rayshard_train": run_rayshard_train,
    "ray_data": run_ray_data,
    "ray_train": run_ray_train,
    "torch": run_torch,
    "raw": run_raw,
}


# ---------------------------------------------------------------------------- driver


def start_ray(num_cpus: int) -> None:
    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "0")
    start_local_ray(num_cpus, "rayshard-bench")


_NOT_RAYS: set[int] = set()  # pids of this tree from before Ray started


def fresh_ray(num_cpus: int) -> None:
    """Stop the local Ray if one runs, start a new one and let its tree settle: each Ray
    loader then starts from the same tree, without the idle workers (and their memory) an
    earlier loader left."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray_pids = set(process_tree()) - {os.getpid()}
        ray.shutdown()
        wait_gone(ray_pids - _NOT_RAYS, timeout_s=30)
    _NOT_RAYS.update(process_tree())  # (multiprocessing's resource tracker, say)
    start_ray(num_cpus)
    settle_tree()


def wait_gone(pids: set[int], timeout_s: float) -> None:
    """Wait until none of `pids` runs (exited, or a zombie)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.2)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :][:1] != b"Z"


def settle_tree(timeout_s: float = 20.0, step_s: float = 0.5) -> None:
    """Wait until the tree's processes stay the same and its PSS within 2% over one step:
    Ray starts its pool workers after `ray.init` returns."""
    deadline = time.time() + timeout_s
    before = (set(process_tree()), tree_pss()[0])
    while time.time() < deadline:
        time.sleep(step_s)
        now = (set(process_tree()), tree_pss()[0])
        if now[0] == before[0] and abs(now[1] - before[1]) <= 0.02 * before[1]:
            return
        before = now


def measure(
    name: str,
    paths: list[str],
    num_rows: int,
    epochs: int,
    warmup: bool,
    world: int = WORLD,
    memory_duty: float = MEMORY_DUTY,
) -> dict:
    """Warm up once, then measure a fresh loader over `epochs` epochs, sampling memory
    with at most `memory_duty` of one core (and at every epoch edge). The tree as it is on
    the call, before the warm-up, is the loader's idle tree (its PSS rise's base)."""
    run = functools.partial(RUNNERS[name], world=world)
    idle_pss = tree_pss()[0]
    if warmup:
        run(paths, 1)
        gc.collect()
        time.sleep(1.0)  # let finished actors and processes exit before the baseline
        wait_for_exit(("ray::ShardReade", "ray::Coordinato"), timeout_s=30)
    begun = time.time()
    on_ray.LEASE_CALLS.clear()  # (filled by a rayshard run)
    with PeakPss(max_duty=memory_duty) as memory, TreeCpu(measuring=[memory.thread]) as cpu:
        records, started = run(paths, epochs, on_edge=memory.sample_now)
    finished = time.time()
    warm_rows = sum(r.rows for r in records if r.epoch > 0)
    warm_cpu = cpu_between(
        cpu.series,
        min(r.start for r in records if r.epoch == 1),
        max(r.end for r in records if r.epoch > 0),
    )
    epochs_out = [
        summarize_epoch([r for r in records if r.epoch == e], num_rows, ROW_BYTES)
        for e in range(epochs)
    ]
    cold = epochs_out[0]
    warm_epochs = sorted(epochs_out[1:], key=lambda e: e["rows_per_s"])
    warm = warm_epochs[len(warm_epochs) // 2]  # the median warm epoch (the upper one of two)
    return {
        "loader": name,
        "rows_per_s": warm["rows_per_s"],
        "steady_rows_per_s": upper_median([e["steady_rows_per_s"] for e in epochs_out[1:]]),
        "slowest_rank_rows_per_s": upper_median(
            [e["slowest_rank_rows_per_s"] for e in epochs_out[1:]]
        ),
        "mb_per_s": warm["mb_per_s"],
        "epoch_s": warm["seconds"],
        # the median of the warm epochs' own, not the median-rows/s epoch's
        "time_to_first_batch_s": upper_median([e["time_to_first_batch_s"] for e in epochs_out[1:]]),
        "cold_time_to_first_batch_s": cold["time_to_first_batch_s"],
        "setup_s": min(r.start for r in records) - begun,
        "launch_to_first_batch_s": max(r.first for r in records if r.epoch == 0) - started,
        "total_s": finished - begun,
        # CPU-seconds of the whole process tree per 1M rows delivered in the warm epochs
        # (from the first one's start to the last one's end, so process start-up is out):
        # what the loader needs, which the machine's other load changes far less than
        # it changes rows/s
        "cpu_s_per_mrow": warm_cpu / max(warm_rows, 1) * 1e6,
        "cpu_s": cpu.seconds,
        "cpu_by_process_s": {k: round(v, 2) for k, v in cpu.by_process().items()},
        **memory_figures(memory, epochs_out, idle_pss),
        "coverage_ok": all(e["coverage"]["ok"] for e in epochs_out),
        # `dynamic`'s lease calls (and paced ones) over all ranks and epochs, cold included
        "lease_calls": dict(on_ray.LEASE_CALLS) or None,
        "epochs": epochs_out,
    }


def memory_figures(memory: PeakPss, epochs_out: list[dict], idle_pss: int) -> dict:
    """The measured run's PSS figures (see the module's docstring): each epoch's peak over
    its samples, those at its edges included; the rise over the loader's idle tree."""
    spans = [(e["start"], e["end"]) for e in epochs_out]
    windows = epoch_windows(spans, memory.edges)
    by_epoch = [peak_between(memory.series, lo, hi) for lo, hi in windows]
    by_epoch_mb = [None if peak is None else peak / MB for peak in by_epoch]
    return {
        "peak_pss_mb": memory.peak / MB,
        "idle_pss_mb": idle_pss / MB,
        "pss_before_run_mb": memory.baseline / MB,  # after the warm-up
        "pss_rise_mb": (memory.peak - idle_pss) / MB,
        "pss_measured": all(peak is not None for peak in by_epoch),
        "pss_by_epoch_mb": [None if p is None else round(p, 1) for p in by_epoch_mb],
        "pss_samples_inside_by_epoch": [samples_between(memory.series, *s) for s in spans],
        # growth of the epochs' peaks from the first sampled warm epoch to the last one
        "pss_growth_mb": growth(by_epoch_mb[1:]),
        "pss_by_process_mb": {
            k: round(v / MB, 1) for k, v in sorted(memory.top.items(), key=lambda kv: -kv[1])
        },
        "pss_by_kind_mb": {k: round(v / MB, 1) for k, v in memory.kinds.items()},
        "pss_samples": memory.samples,
        "pss_edge_samples": len(memory.edges),
        "pss_sampler_cpu_s": memory.cpu_s,
    }


AT_MOST = ("time_to_first_batch_s", "pss_vs_raw", "pss_rise_vs_raw")
NOT_MEASURED = "not measured (an epoch had no PSS sample)"


def pss_ratio(result: dict, raw: dict, key: str) -> float | None:
    """`result[key]` over the raw scan's, or None if either run's memory was not
    measured in every epoch."""
    if not (result["pss_measured"] and raw["pss_measured"]):
        return None
    return result[key] / max(raw[key], 1e-9)


def check(value: float | None, target: float, at_most: bool) -> dict:
    """One target: met or missed, or not measured (`value` None)."""
    if value is None:
        return {"value": None, "target": target, "met": None, "status": NOT_MEASURED}
    met = bool(value <= target if at_most else value >= target)
    return {"value": value, "target": target, "met": met, "status": "met" if met else "MISSED"}


def add_ratios(results: dict[str, dict]) -> dict:
    """Ratios against raw and Ray Data from this same run, and the targets for rayshard."""
    raw, ray_data = results.get("raw"), results.get("ray_data")
    shard = results.get("rayshard")
    for result in results.values():
        if raw:
            result["rows_vs_raw"] = result["rows_per_s"] / raw["rows_per_s"]
            result["slowest_rank_vs_raw"] = (
                result["slowest_rank_rows_per_s"] / raw["slowest_rank_rows_per_s"]
            )
            result["pss_vs_raw"] = pss_ratio(result, raw, "peak_pss_mb")
            result["cpu_vs_raw"] = result["cpu_s_per_mrow"] / max(raw["cpu_s_per_mrow"], 1e-9)
            result["pss_rise_vs_raw"] = pss_ratio(result, raw, "pss_rise_mb")
        if ray_data:
            result["rows_vs_ray_data"] = result["rows_per_s"] / ray_data["rows_per_s"]
            result["steady_vs_ray_data"] = (
                result["steady_rows_per_s"] / ray_data["steady_rows_per_s"]
            )
        if shard:
            result["rows_vs_rayshard"] = result["rows_per_s"] / shard["rows_per_s"]
    checks = {}
    for name, key, target in VARIANT_TARGETS:
        if key in results.get(name, {}):
            checks[f"{name} {key}"] = check(results[name][key], target, key.endswith("_s"))
    if shard is None:
        return checks
    for key, target in TARGETS.items():
        if key in shard:
            checks[key] = check(shard[key], target, key in AT_MOST)
    checks["cold_time_to_first_batch_s"] = check(
        shard["cold_time_to_first_batch_s"], TARGETS["time_to_first_batch_s"], True
    )
    if "pss_rise_vs_raw" in shard:
        checks["pss_rise_vs_raw"] = check(shard["pss_rise_vs_raw"], TARGETS["pss_vs_raw"], True)
    return checks


def format_check(key: str, result: dict) -> str:
    """One printed line: `rayshard pss_vs_raw: 0.912 (target <= 1.5) met`."""
    name = key if " " in key else f"rayshard {key}"
    value = "-" if result["value"] is None else f"{result['value']:.3f}"
    at_most = key.split()[-1] in AT_MOST or key.endswith("_s")
    target = f"{'<=' if at_most else '>='} {result['target']}"
    return f"{name}: {value} (target {target}) {result['status']}"


TABLE = (
    ("loader", "loader", "s"),
    ("rows/s", "rows_per_s", ",.0f"),
    ("steady rows/s", "steady_rows_per_s", ",.0f"),
    ("by slowest rank", "slowest_rank_rows_per_s", ",.0f"),
    ("MB/s", "mb_per_s", ".0f"),
    ("epoch s", "epoch_s", ".2f"),
    ("vs raw", "rows_vs_raw", ".2f"),
    ("vs ray_data", "rows_vs_ray_data", ".2f"),
    ("CPU s/Mrow", "cpu_s_per_mrow", ".2f"),
    ("CPU vs raw", "cpu_vs_raw", ".2f"),
    ("TTFB warm s", "time_to_first_batch_s", ".3f"),
    ("TTFB cold s", "cold_time_to_first_batch_s", ".3f"),
    ("launch s", "launch_to_first_batch_s", ".2f"),
    ("setup s", "setup_s", ".2f"),
    ("peak PSS MB", "peak_pss_mb", ".0f"),
    ("PSS rise MB", "pss_rise_mb", ".0f"),
    ("PSS growth MB", "pss_growth_mb", ".0f"),
    ("coverage", "coverage", "s"),
)
DEFINITIONS = {
    "time_to_first_batch_s": "median of the warm epochs' times to first batch (slowest rank)",
    "steady_rows_per_s": "per rank, rows after its first batch over its first to last "
    "batch, summed over ranks; median warm epoch",
    "idle_pss_mb": "the loader's tree before its warm-up: the driver alone (raw, torch), "
    "or the driver and a just-started, settled local Ray (Ray loaders)",
    "pss_rise_mb": "peak_pss_mb minus idle_pss_mb",
    "pss_by_epoch_mb": "each epoch's peak over its samples, those at its edges included",
    "pss_measured": "every epoch had a PSS sample; if not, PSS checks are not measured",
}
LEGEND = (
    "TTFB warm: median of the warm epochs'; steady: per rank, rows after its first batch "
    "over its first to last batch, summed; PSS rise: peak minus the loader's tree before "
    "its warm-up (raw, torch: the driver alone; Ray loaders: the driver and a just-started "
    "local Ray)"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to generate")
    parser.add_argument("--quick", action="store_true", help="100k rows (smoke test)")
    parser.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated subset")
    parser.add_argument(
        "--epochs", type=int, default=4, help="measured epochs (the first is cold; >= 2)"
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up run")
    parser.add_argument("--ranks", type=int, default=WORLD, help="data-parallel ranks")
    parser.add_argument("--ray-cpus", type=int, default=4, help="logical CPUs for ray.init")
    parser.add_argument("--data", type=Path, help="dataset folder (default: a temp folder)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write JSON")
    parser.add_argument(
        "--memory-duty",
        type=float,
        default=MEMORY_DUTY,
        help="share of one core the PSS sampler may use (more: finer memory figures, "
        "and fewer rows/s for the loaders of many processes)",
    )
    parser.add_argument(
        "--ack-interval",
        type=float,
        help="the rayshard loaders' ack_interval_s (default: the loader's, 0.1 s): longer "
        "is fewer coordinator calls, and more samples repeated after a lost rank",
    )
    parser.add_argument(
        "--split-rows",
        type=int,
        help="the rayshard loaders' ParquetSource(split_rows=...): splits (and `dynamic`'s "
        "leases) of at most that many rows, pieces of the row groups (default: whole row groups)",
    )
    args = parser.parse_args(argv)
    if args.ack_interval is not None and args.ack_interval < 0:
        parser.error(f"--ack-interval {args.ack_interval}: give seconds, 0 or more")
    if args.split_rows is not None and args.split_rows < 1:
        parser.error(f"--split-rows {args.split_rows}: give rows, 1 or more")
    if not 0 < args.memory_duty <= 1:
        parser.error(f"--memory-duty {args.memory_duty}: give a share of one core in (0, 1]")
    if args.quick:
        args.rows = min(args.rows, 100_000)
    names = [n.strip() for n in args.loaders.split(",") if n.strip()]
    unknown = [n for n in names if n not in LOADERS]
    if unknown or not names:
        parser.error(
            f"argument --loaders: invalid choice {','.join(unknown) or args.loaders!r} "
            f"(choose from {', '.join(LOADERS)})"
        )
    for option, value, low in (
        ("--rows", args.rows, 1),
        ("--epochs", args.epochs, 2),
        ("--ranks", args.ranks, 1),
    ):
        if value < low:
            parser.error(f"Invalid value for '{option}': {value} is not in the range x>={low}.")
    # A Train worker holds one CPU for the whole run, and Ray Data's reads under
    # `ray_train` need one more: with fewer, the run waits forever for resources.
    for name, needed in (("rayshard_train", args.ranks), ("ray_train", args.ranks + 1)):
        if name in names and args.ray_cpus < needed:
            parser.error(
                f"--ray-cpus={args.ray_cpus} is too few for {name} with --ranks={args.ranks}: "
                f"it needs at least {needed} (a CPU per Train worker"
                f"{', and one for Ray Data' if name == 'ray_train' else ''}); "
                f"raise --ray-cpus or leave {name} out"
            )
    # Non-Ray loaders first, before Ray starts, so their process tree holds no Ray.
    args.names = sorted(names, key=lambda n: (n in RAY_LOADERS, LOADERS.index(n)))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder = args.data or Path(tempfile.gettempdir()) / f"rayshard-loader-bench-{args.rows}"
    try:
        check_folder(folder)
    except FileExistsError as error:
        print(f"loader bench: {error}", file=sys.stderr)
        return 2
    # Generate in a child process, so the driver's memory (counted in every PSS) stays small.
    writer = mp.get_context("spawn").Process(target=make_dataset, args=(folder, args.rows))
    writer.start()
    writer.join()
    if writer.exitcode != 0:
        print(f"loader bench: writing the dataset into {folder} failed", file=sys.stderr)
        return 1
    paths = parquet_files(folder)
    num_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
    print(
        f"loader bench: {num_rows:,} rows ({num_rows * ROW_BYTES / MB:,.0f} MB as numpy) in "
        f"{len(paths)} Parquet files, batch {BATCH_SIZE}, {args.ranks} ranks, "
        f"loaders {', '.join(args.names)}",
        flush=True,
    )
    if args.ack_interval is not None:
        on_ray.LOADER_OPTIONS["ack_interval_s"] = args.ack_interval
    on_ray.SOURCE_OPTIONS["split_rows"] = args.split_rows
    results: dict[str, dict] = {}
    bar = tqdm(args.names, desc="loaders", unit="loader", disable=None, file=sys.stderr)
    for name in bar:
        bar.set_postfix_str(name)
        if name in RAY_LOADERS:
            fresh_ray(args.ray_cpus)
        results[name] = measure(
            name, paths, num_rows, args.epochs, not args.no_warmup, args.ranks, args.memory_duty
        )
        gc.collect()
    bar.close()
    checks = add_ratios(results)
    rows = [{**r, "coverage": "ok" if r["coverage_ok"] else "FAILED"} for r in results.values()]
    print(format_table(rows, TABLE))
    print(LEGEND)
    for key, result in checks.items():
        print(format_check(key, result))
    report = {
        "config": {
            "rows": num_rows,
            "files": len(paths),
            "batch_size": BATCH_SIZE,
            "world_size": args.ranks,
            "columns": COLUMNS,
            "row_bytes": ROW_BYTES,
            "epochs": args.epochs,
            "warmup": not args.no_warmup,
            "ray_cpus": args.ray_cpus,
            "memory_duty": args.memory_duty,
            "ack_interval_s": args.ack_interval,  # None: the loader's default
            "split_rows": args.split_rows,  # None: whole row groups
            "data": str(folder),
        },
        "definitions": DEFINITIONS,
        "results": results,
        "targets": checks,
    }
    write_json(args.json, report)
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
    return 0 if all(r["coverage_ok"] for r in results.values()) else 1


__all__ = ["LOADERS", "main"]
