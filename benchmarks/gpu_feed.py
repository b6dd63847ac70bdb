"""Benchmark the device feed: bandwidth, data stalls and host memory.

    python benchmarks/gpu_feed.py [--quick] [--device cpu|cuda] [--json out.json]

(a) Bandwidth through `DeviceFeed` (read-only numpy -> staging -> device) against a raw
    `copy_` of the same tensors from pinned memory (on the CPU: a plain copy). Target:
    ratio >= 0.8. The ratio uses a pool warmed by an untimed run (the steady state of an
    epoch); the bandwidth of a feed that page-locks fresh buffers is reported beside it.
(b) Data-stall fraction of a synthetic training step (a matmul loop of fixed duration)
    when the loader outpaces the model: time the step waits in `next()` / wall time.
    Target: < 2%.
(c) Peak host memory (RSS, Linux) during a run against the bound
    (prefetch_depth + 2) x batch bytes + a constant.

Prints a table and writes JSON (default `benchmarks/results/gpu_feed.json`).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rayshard.device import DeviceFeed, HostBufferPool  # noqa: E402

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "gpu_feed.json"
MIB = 1 << 20
MEMORY_CONSTANT_BYTES = 32 * MIB  # thread stacks, allocator slack, small bookkeeping


def make_source_arrays(batch_bytes: int, count: int = 4) -> list[np.ndarray]:
    """Read-only float32 arrays like those a Ray worker gets from the object store."""
    rows = max(1, batch_bytes // (4 * 1024))
    arrays = []
    for index in range(count):
        array = np.full((rows, 1024), float(index), dtype=np.float32)
        array.setflags(write=False)
        arrays.append(array)
    return arrays


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_of(repeats: int, run) -> float:
    """The best of `repeats` timed runs after one untimed warm-up run (allocator, caches)."""
    run()
    return max(run() for _ in range(repeats))


def feed_bandwidth(
    arrays: list[np.ndarray],
    batches: int,
    device: torch.device,
    depth: int,
    pool: HostBufferPool | None = None,
) -> float:
    """GB/s through the feed, end to end (staging copy included). With `pool`, the staging
    buffers of an earlier run are reused, as over a long epoch: the steady state, without
    page-locking fresh buffers (the raw baseline pins its buffers before timing too)."""
    source = ({"x": arrays[i % len(arrays)]} for i in range(batches))
    started = time.perf_counter()
    with DeviceFeed(source, device=device, prefetch_depth=depth, pool=pool) as feed:
        for batch in feed:
            del batch
        synchronize(device)
    elapsed = time.perf_counter() - started
    return batches * arrays[0].nbytes / elapsed / 1e9


def empty_host_cache(device: torch.device) -> bool:
    """Return torch's cached page-locked blocks to the system, so a fresh pool pays for
    locking its buffers as a new process would; False where this torch cannot."""
    if device.type != "cuda":
        return False
    synchronize(device)
    for empty in (
        getattr(getattr(torch, "accelerator", None), "empty_host_cache", None),  # newer torch
        getattr(torch._C, "_host_emptyCache", None),  # older 2.x
    ):
        if empty is not None:
            empty()
            return True
    return False


def raw_copy_bandwidth(arrays: list[np.ndarray], batches: int, device: torch.device) -> float:
    """GB/s of `copy_` from (pinned, on CUDA) host tensors into fresh device tensors."""
    pin = device.type == "cuda"
    hosts = [torch.from_numpy(a.copy()) for a in arrays]
    hosts = [h.pin_memory() if pin else h for h in hosts]
    synchronize(device)
    started = time.perf_counter()
    for index in range(batches):
        host = hosts[index % len(hosts)]
        target = torch.empty(host.shape, dtype=host.dtype, device=device)
        target.copy_(host, non_blocking=pin)
        del target
    synchronize(device)
    elapsed = time.perf_counter() - started
    return batches * arrays[0].nbytes / elapsed / 1e9


def train_step(weights: torch.Tensor, batch: dict[str, torch.Tensor], seconds: float) -> None:
    """A model step of fixed duration: matmuls until `seconds` have passed, then use the batch."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        weights = weights @ weights
        weights = weights / (weights.norm() + 1)
        synchronize(weights.device)
    float(batch["x"][0, 0])


def stall_fraction(
    arrays: list[np.ndarray], steps: int, step_seconds: float, device: torch.device, depth: int
) -> dict[str, float]:
    """Fraction of wall time the step loop waits for data (the first, warm-up batch excluded)."""
    weights = torch.randn(64, 64, device=device)
    source = ({"x": arrays[i % len(arrays)]} for i in range(steps + 1))
    with DeviceFeed(source, device=device, prefetch_depth=depth) as feed:
        train_step(weights, next(feed), 0.0)
        warmup_stall = feed.stats().stall_seconds
        started = time.perf_counter()
        for batch in feed:
            train_step(weights, batch, step_seconds)
        wall = time.perf_counter() - started
        stall = feed.stats().stall_seconds - warmup_stall
    return {"wall_seconds": wall, "stall_seconds": stall, "stall_fraction": stall / wall}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory(
    arrays: list[np.ndarray], batches: int, device: torch.device, depth: int
) -> dict[str, Any]:
    """Peak RSS above the starting RSS while a feed runs (Linux: VmHWM after clear_refs)."""
    if not Path("/proc/self/clear_refs").exists():
        return {"supported": False}
    batch_bytes = arrays[0].nbytes
    source = ({"x": arrays[i % len(arrays)]} for i in range(batches))
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset the high-water mark to the current RSS
    baseline = _status_kib("VmRSS") * 1024
    with DeviceFeed(source, device=device, prefetch_depth=depth) as feed:
        for batch in feed:
            float(batch["x"][0, 0])
        synchronize(device)
    peak = _status_kib("VmHWM") * 1024
    bound = (depth + 2) * batch_bytes + MEMORY_CONSTANT_BYTES
    delta = peak - baseline
    return {
        "supported": True,
        "batch_bytes": batch_bytes,
        "peak_rss_delta_bytes": delta,
        "peak_rss_delta_batches": delta / batch_bytes,
        "bound_bytes": bound,
        "constant_bytes": MEMORY_CONSTANT_BYTES,
        "within_bound": delta <= bound,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write JSON")
    parser.add_argument("--prefetch-depth", type=int, default=2)
    parser.add_argument("--batch-mib", type=float, default=None, help="bytes per batch, MiB")
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--step-ms", type=float, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    batch_mib = args.batch_mib or (4 if args.quick else 32)
    batches = args.batches or (10 if args.quick else 40)
    steps = args.steps or (10 if args.quick else 50)
    step_ms = args.step_ms or (10.0 if args.quick else 40.0)
    depth = args.prefetch_depth
    # (b) needs a loader that outpaces the model: a batch a sixteenth the size of (a)'s.
    stall_mib = max(batch_mib / 16, 0.25)
    if device.type == "cuda":
        torch.zeros(1, device=device)  # create the CUDA context before measuring memory

    arrays = make_source_arrays(int(batch_mib * MIB))
    small = make_source_arrays(int(stall_mib * MIB))
    # One small run first, so one-time start-up costs do not count as feed memory.
    feed_bandwidth(small, 2, device, depth)
    memory = peak_memory(arrays, batches, device, depth)
    # One pool for every timed run; best_of's untimed warm-up run fills it.
    pool = HostBufferPool() if device.type == "cuda" else None
    feed_gbps = best_of(3, lambda: feed_bandwidth(arrays, batches, device, depth, pool))
    host_cache_emptied = empty_host_cache(device)  # so a fresh pool page-locks afresh
    cold_feed_gbps = feed_bandwidth(arrays, batches, device, depth)
    raw_gbps = best_of(3, lambda: raw_copy_bandwidth(arrays, batches, device))
    stall = stall_fraction(small, steps, step_ms / 1000, device, depth)
    result = {
        "device": device.type,
        "torch": torch.__version__,
        "platform": platform.platform(),
        "config": {
            "batch_bytes": arrays[0].nbytes,
            "batches": batches,
            "prefetch_depth": depth,
            "stall_batch_bytes": small[0].nbytes,
            "steps": steps,
            "step_ms": step_ms,
            "quick": args.quick,
        },
        "bandwidth": {
            "feed_gbps": feed_gbps,
            "feed_gbps_fresh_pool": cold_feed_gbps,
            "fresh_pool_host_cache_emptied": host_cache_emptied,
            "baseline_gbps": raw_gbps,
            "baseline": "pinned copy_" if device.type == "cuda" else "plain copy",
            "ratio": feed_gbps / raw_gbps,
            "target_ratio": 0.8,
        },
        "stall": {**stall, "target_fraction": 0.02},
        "memory": memory,
    }
    print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return result


def print_table(result: dict[str, Any]) -> None:
    bandwidth, stall, memory = result["bandwidth"], result["stall"], result["memory"]
    rows = [
        ("device", result["device"], ""),
        ("feed bandwidth", f"{bandwidth['feed_gbps']:.2f} GB/s", ""),
        ("  with a fresh pool", f"{bandwidth['feed_gbps_fresh_pool']:.2f} GB/s", ""),
        (f"{bandwidth['baseline']} bandwidth", f"{bandwidth['baseline_gbps']:.2f} GB/s", ""),
        ("bandwidth ratio", f"{bandwidth['ratio']:.2f}", ">= 0.80"),
        ("stall fraction", f"{stall['stall_fraction']:.2%}", "< 2%"),
    ]
    if memory.get("supported"):
        rows += [
            ("peak RSS delta", f"{memory['peak_rss_delta_bytes'] / MIB:.1f} MiB", ""),
            ("  in batches", f"{memory['peak_rss_delta_batches']:.2f}", ""),
            ("bound (depth+2)*batch+c", f"{memory['bound_bytes'] / MIB:.1f} MiB", ""),
        ]
    width = max(len(name) for name, _, _ in rows)
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>14}  {target}".rstrip())


if __name__ == "__main__":
    main()
