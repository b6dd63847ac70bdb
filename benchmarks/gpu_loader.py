"""Loaders feeding one GPU: rayshard's device feed against Ray Data `iter_torch_batches`.

    python -m benchmarks.gpu_loader [--rows N] [--epochs E] [--step-ms S] [--ray-cpus C]
                                    [--loaders rayshard,rayshard:4,ray_data] [--json PATH]

(`rayshard:4`: rayshard with `reader_threads=4`.)

One rank in the driver process (the process that owns the GPU) reads the loader
benchmark's Parquet data (`x` fixed_size_list<float32>[128], `label`, `id`; batch 1024):

  rayshard   `Loader(ParquetSource).iterator(batch_format="torch", device="cuda")`: the
             rank reads in the driver's own reading threads (`consumer_reads`, the
             default), the device feed packs each batch into a pinned buffer and copies it
             on a side stream, `prefetch_depth=2`
  ray_data   `read_parquet(...).iter_torch_batches(device="cuda", pin_memory=True,
             prefetch_batches=2)`

Two loops per loader (three with `--host-step`), each over `--epochs` epochs after one
warm-up epoch (medians of the warm epochs are reported):

  deliver    rows/s delivered to the device: each batch's `x` is summed on the GPU (no host
             synchronisation per batch), one synchronisation at the end of the epoch
  step       a synthetic training step of `--step-ms` on the GPU per batch (`torch.cuda._sleep`
             calibrated to the clock, then a read of the batch and a host synchronisation,
             like `loss.item()`); stall fraction = time spent waiting in `next()` / wall time
  host_step  (`--host-step`) the same step as a host sleep, no CUDA sync: if rayshard keeps
             up here and not under `step`, what stalls it is the CUDA wait, not the reading;
             rayshard's device feed reports its staging thread's time per batch in each
             phase (source, stage, copy, handover) for every loop

Coverage (every id exactly once per epoch) is checked in every epoch. Writes
`benchmarks/results/gpu_loader.json`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks._report import ROOT, start_local_ray, write_json
from benchmarks.loaders.data import BATCH_SIZE, COLUMNS, make_dataset, parquet_files

DEFAULT_JSON = ROOT / "benchmarks" / "results" / "gpu_loader.json"
LOADERS = ("rayshard", "ray_data")


def calibrate_sleep_cycles(torch, device) -> float:
    """GPU cycles per millisecond of `torch.cuda._sleep` on this device."""
    torch.cuda._sleep(1000)
    torch.cuda.synchronize(device)
    cycles = 20_000_000
    started = time.perf_counter()
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize(device)
    return cycles / ((time.perf_counter() - started) * 1000)


def run_epoch(
    torch, device, batches, rows: int, step_cycles: int, host_step_s: float = 0.0, probe=None
) -> dict[str, Any]:
    """Consume one epoch; returns wall time, time waiting in next(), rows and coverage, and
    what `probe()` reports at its end (rayshard: the device feed's statistics)."""
    seen = torch.zeros(rows, dtype=torch.int32, device=device)  # coverage, kept on the GPU
    total = torch.zeros((), device=device)
    iterator = iter(batches)
    waited = 0.0
    first_batch_s = None
    started = time.perf_counter()
    while True:
        asked = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        now = time.perf_counter()
        waited += now - asked
        if first_batch_s is None:
            first_batch_s = now - started
        ids = batch["id"].to(device, non_blocking=True)
        real = torch.ones_like(ids, dtype=torch.int32)
        if "_padded" in batch:  # padding rows count nothing (no host sync: no masking)
            real = (~batch["_padded"].to(device, non_blocking=True)).to(torch.int32)
        x = batch["x"]
        if x.device != device:
            raise TypeError(f"x arrived on {x.device}, expected {device}")
        if host_step_s:  # the host busy elsewhere, no CUDA sync: the control for `step`
            time.sleep(host_step_s)
            total += x.sum()
        elif step_cycles and device.type == "cpu":  # a smoke run without a GPU
            time.sleep(step_cycles / 1e6)
            total += x.sum()
        elif step_cycles:
            torch.cuda._sleep(step_cycles)
            total += x.sum()
            float(total)  # the host waits for the step, like loss.item()
        else:
            total += x.sum()
        seen.index_add_(0, ids, real)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - started
    count = int(seen.sum())
    waited_after_first = waited - (first_batch_s or 0.0)
    return {
        **({"feed": probe()} if probe else {}),
        "wall_s": wall,
        "rows": count,
        "rows_per_s": count / wall,
        "first_batch_s": first_batch_s,
        "stall_s": waited_after_first,
        "stall_fraction": waited_after_first / max(wall - (first_batch_s or 0.0), 1e-9),
        "coverage_ok": bool(torch.all(seen == 1)),
    }


def rayshard_epochs(paths, rows, torch, device, args, step_cycles, reader_threads=None):
    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    loader = Loader(
        ParquetSource(paths, columns=COLUMNS),
        batch_size=BATCH_SIZE,
        name=f"gpu-bench-{uuid.uuid4().hex[:8]}",
        policy="data",
        shuffle=False,
        prefetch_depth=2,
        columns=COLUMNS,
        reader_threads=reader_threads or args.reader_threads,
    )
    try:
        batches = loader.iterator(world_rank=0, world_size=1, batch_format="torch", device=device)
        return run_loops(torch, device, batches, rows, args, step_cycles, probe=feed_probe(batches))
    finally:
        loader.shutdown()


def ray_data_epochs(paths, rows, torch, device, args, step_cycles):
    import ray

    dataset = ray.data.read_parquet(paths).select_columns(COLUMNS)

    def batches():
        return dataset.iter_torch_batches(
            batch_size=BATCH_SIZE,
            device=device,
            pin_memory=device.type == "cuda",
            prefetch_batches=2,
        )

    return run_loops(torch, device, batches, rows, args, step_cycles)


def feed_probe(iterator):
    """The rayshard iterator's device feed statistics of the epoch just ended (the feed is
    replaced when the next epoch begins)."""
    return lambda: iterator.stats().get("feed")


def run_loops(torch, device, batches, rows, args, step_cycles, probe=None) -> dict[str, list]:
    """Each loop's epochs, the first of each a warm-up: `deliver`, `step` and, with
    `--host-step`, `host_step` (the same step as a host sleep, no CUDA sync)."""
    loops = {"deliver": {}, "step": {"step_cycles": step_cycles}}
    if args.host_step:
        loops["host_step"] = {"host_step_s": args.step_ms / 1000}
    return {
        name: [
            run_epoch(
                torch,
                device,
                iter(batches()) if callable(batches) else batches,
                rows,
                **{"step_cycles": 0, **kind},
                probe=probe,
            )
            for _ in range(args.epochs + 1)
        ]
        for name, kind in loops.items()
    }


RUNNERS = {"rayshard": rayshard_epochs, "ray_data": ray_data_epochs}


def summarize(loops: dict[str, list[dict]]) -> dict[str, Any]:
    """Medians of each loop's warm epochs; with the device feed's statistics, the staging
    thread's seconds per batch in each phase (where a stall comes from)."""
    warm = {name: epochs[1:] for name, epochs in loops.items()}
    result = {
        "rows_per_s": statistics.median(e["rows_per_s"] for e in warm["deliver"]),
        "first_batch_s_warm": statistics.median(e["first_batch_s"] for e in warm["deliver"]),
        "coverage_ok": all(e["coverage_ok"] for epochs in loops.values() for e in epochs),
        "epochs": loops,
    }
    for name, epochs in warm.items():
        prefix = "" if name == "deliver" else f"{name}_"
        if name != "deliver":
            result[f"{prefix}stall_fraction"] = statistics.median(
                e["stall_fraction"] for e in epochs
            )
            result[f"{prefix}rows_per_s"] = statistics.median(e["rows_per_s"] for e in epochs)
        feeds = [e["feed"] for e in epochs if e.get("feed")]
        if feeds:
            result[f"{name}_feed_ms_per_batch"] = {
                phase: statistics.median(
                    1000 * f[f"{phase}_seconds"] / max(f["batches_delivered"], 1) for f in feeds
                )
                for phase in ("source", "stage", "copy", "handover")
            }
    return result


def print_table(results: dict[str, dict]) -> None:
    """One line per loader, then the device feed's phases per loop (rayshard only)."""
    base = results.get("ray_data", {}).get("rows_per_s")
    host = any("host_step_rows_per_s" in result for result in results.values())
    print(
        f"{'loader':<10} {'rows/s to GPU':>14} {'x Ray Data':>10} {'stall @step':>12} "
        f"{'step rows/s':>12} {'TTFB warm':>10} coverage"
        + (f" {'stall @host step':>16} {'host step rows/s':>16}" if host else "")
    )
    for name, result in results.items():
        ratio = result["rows_per_s"] / base if base else float("nan")
        line = (
            f"{name:<10} {result['rows_per_s']:>14,.0f} {ratio:>10.2f} "
            f"{result['step_stall_fraction']:>12.2%} {result['step_rows_per_s']:>12,.0f} "
            f"{result['first_batch_s_warm']:>10.3f} {result['coverage_ok']}"
        )
        if host:
            line += (
                f" {result['host_step_stall_fraction']:>16.2%}"
                f" {result['host_step_rows_per_s']:>16,.0f}"
            )
        print(line)
    for name, result in results.items():
        for key, phases in result.items():
            if key.endswith("_feed_ms_per_batch"):
                loop = key.removesuffix("_feed_ms_per_batch")
                spent = ", ".join(f"{phase} {ms:.3f}" for phase, ms in phases.items())
                print(f"{name} {loop}: staging thread ms per batch: {spent}")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--epochs", type=int, default=3, help="warm epochs per loop")
    parser.add_argument("--step-ms", type=float, default=1.0, help="synthetic step per batch")
    parser.add_argument("--ray-cpus", type=int, default=None)
    parser.add_argument(
        "--reader-threads",
        type=int,
        default=None,
        help="reading threads of `rayshard` (default: the loader's, this process's CPUs, <= 8)",
    )
    parser.add_argument("--loaders", default=",".join(LOADERS))
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run")
    parser.add_argument(
        "--host-step",
        action="store_true",
        help="a third loop whose step is a host sleep of --step-ms (no CUDA sync)",
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    args.loaders = [name.strip() for name in args.loaders.split(",") if name.strip()]
    unknown = [name for name in args.loaders if name.split(":")[0] not in RUNNERS]
    if unknown:
        parser.error(f"--loaders: unknown {unknown}; choose from {list(RUNNERS)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import os

    import torch

    args = parse_args(argv)
    if args.device == "cpu":
        device = torch.device("cpu")
        step_cycles = max(1, int(args.step_ms * 1000))  # microseconds of time.sleep
    else:
        if not torch.cuda.is_available():
            sys.exit("benchmarks.gpu_loader needs CUDA (or --device cpu for a smoke run)")
        device = torch.device("cuda", torch.cuda.current_device())
        torch.zeros(1, device=device)
        cycles_per_ms = calibrate_sleep_cycles(torch, device)
        step_cycles = max(1, int(args.step_ms * cycles_per_ms))
    with tempfile.TemporaryDirectory(prefix="rayshard-gpu-bench-") as scratch:
        folder = make_dataset(args.data or Path(scratch) / "data", args.rows)
        paths = parquet_files(folder)
        start_local_ray(args.ray_cpus or os.cpu_count() or 2, "rayshard-gpu-bench")
        results = {}
        for name in args.loaders:
            started = time.perf_counter()
            # "rayshard:4": rayshard with 4 reader threads
            runner, _, threads = name.partition(":")
            extra = {"reader_threads": int(threads)} if threads else {}
            epochs = RUNNERS[runner](paths, args.rows, torch, device, args, step_cycles, **extra)
            results[name] = summarize(epochs)
            print(f"{name}: done in {time.perf_counter() - started:.1f} s", flush=True)
    print_table(results)
    report = {
        "config": {
            "rows": args.rows,
            "epochs": args.epochs,
            "batch_size": BATCH_SIZE,
            "step_ms": args.step_ms,
            "ray_cpus": args.ray_cpus or os.cpu_count(),
            "reader_threads": args.reader_threads,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "host_step": args.host_step,
        },
        "results": results,
        "targets": {"rows_vs_ray_data": 2.0, "stall_fraction": 0.02},
    }
    write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
