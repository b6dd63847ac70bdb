"""How well the orders rayshard can deliver are shuffled, in one process, without Ray.

    python -m benchmarks.shuffle_quality [--rows N] [--split-rows R] [--world W]
                                         [--buffer B] [--block-rows K]

Defaults: N=1,000,000, R=10,000, W=4, B=10,000, K=100,000.

A Parquet file of N rows (`id` int64, `x` fixed_size_list<float32>[16]; row groups of R
rows, the splits) is read as rank 0 of W reads it under the `data` policy, through the
readers' own pure pieces (`reading_pieces`, `iter_rows`, `shuffle_batches`), in these
orders:

- `none`: the rank's shard in dataset order;
- `split+buffer`: `shuffle=True` (the rank's splits permuted for (seed, epoch, rank)) plus
  `shuffle_buffer=B` rows;
- `shuffle_blocks`: `shuffle_blocks=K`, the streaming global shuffle (MosaicML Streaming
  `py1b`-like): the splits permuted for (seed, epoch) into one sequence, rank 0 reading
  its planned count along it, its rows permuted in blocks of K consecutive rows.

Reported per order: Spearman rank correlation between the samples' dataset positions and
their delivery order (0: no trace of the dataset order), the mean distance between
consecutive samples' positions as a fraction of N (a uniform permutation gives 1/3), how
many of the dataset's splits the rank's first 10% of samples come from, the rows held at
once (buffer or block), and rows per second of the in-process pipeline (reading,
decoding, shuffling; no Ray, no object store; the better of two runs).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rayshard.config.loader_config import LoaderConfig
from rayshard.core.planning import epoch_plan
from rayshard.core.shuffle import shuffle_batches
from rayshard.core.shuffle_blocks import block_shuffle
from rayshard.data.batching import iter_rows
from rayshard.data.reading_order import reading_pieces
from rayshard.plan import PlanConfig
from rayshard.sources.parquet import ParquetSource

SEED, EPOCH = 7, 0


def _write(folder: str, rows: int, split_rows: int) -> str:
    ids = np.arange(rows, dtype=np.int64)
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 16).astype(np.float32)), 16)
    path = os.path.join(folder, "data.parquet")
    pq.write_table(pa.table({"id": ids, "x": x}), path, row_group_size=split_rows)
    return path


def _indices(batches) -> np.ndarray:
    return np.concatenate(
        [np.asarray(b.column(b.schema.get_field_index("_index"))) for b in batches]
    )


def _rank0(source: ParquetSource, world: int, shuffle: bool, buffer: int) -> np.ndarray:
    settings = LoaderConfig(plan=PlanConfig(batch_size=1024, seed=SEED), shuffle=shuffle)
    ranges = epoch_plan(settings, source, world, EPOCH).ranks[0].ranges
    pieces = reading_pieces(
        ranges, source.splits(), shuffle=shuffle, rng_key=f"rayshard:{SEED}:{EPOCH}:0"
    )
    rows = iter_rows(source, pieces, None)
    if buffer:
        rows = shuffle_batches(rows, buffer, SEED, EPOCH, 0)
    return _indices(rows)


def _blocks_rank0(source: ParquetSource, world: int, block_rows: int) -> np.ndarray:
    """`shuffle_blocks=block_rows`: rank 0's share of the global split sequence, its rows
    permuted in blocks (the reader's own pieces)."""
    settings = LoaderConfig(plan=PlanConfig(batch_size=1024, seed=SEED), shuffle_blocks=block_rows)
    ranges = epoch_plan(settings, source, world, EPOCH).ranks[0].ranges
    pieces = reading_pieces(ranges, source.splits(), shuffle=False, rng_key="")
    return _indices(block_shuffle(iter_rows(source, pieces, None), block_rows, SEED, EPOCH, 0))


def _metrics(order: np.ndarray, n: int, split_rows: int) -> dict:
    positions = np.arange(len(order))
    ranks = np.empty(len(order))
    ranks[np.argsort(order, kind="stable")] = positions
    spearman = float(np.corrcoef(ranks, positions)[0, 1])
    head = order[: max(1, len(order) // 10)]
    return {
        "spearman": spearman,
        "mean_jump": float(np.abs(np.diff(order)).mean() / n) if len(order) > 1 else 0.0,
        "splits_in_first_10pct": int(len(np.unique(head // split_rows))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--split-rows", type=int, default=10_000)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--buffer", type=int, default=10_000)
    parser.add_argument("--block-rows", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        source = ParquetSource(_write(folder, args.rows, args.split_rows))
        row_bytes = 8 + 16 * 4
        runs = {
            "none": (lambda: _rank0(source, args.world, False, 0), 0),
            "split+buffer": (lambda: _rank0(source, args.world, True, args.buffer), args.buffer),
            "shuffle_blocks": (
                lambda: _blocks_rank0(source, args.world, args.block_rows),
                args.block_rows,
            ),
        }
        print(
            f"{args.rows} rows, splits of {args.split_rows}, rank 0 of {args.world}, "
            f"buffer {args.buffer}, blocks of {args.block_rows} rows"
        )
        print(
            f"{'order':<18} {'spearman':>9} {'mean jump/N':>11} {'splits@10%':>10} "
            f"{'rows held':>9} {'MiB held':>8} {'rows/s':>10}"
        )
        for name, (run, held) in runs.items():
            seconds = float("inf")
            for _ in range(2):  # the better of two runs (the first may find a cold cache)
                started = time.perf_counter()
                order = run()
                seconds = min(seconds, time.perf_counter() - started)
            m = _metrics(order, args.rows, args.split_rows)
            print(
                f"{name:<18} {m['spearman']:>9.3f} {m['mean_jump']:>11.4f} "
                f"{m['splits_in_first_10pct']:>10} {held:>9} {held * row_bytes / 2**20:>8.1f} "
                f"{len(order) / seconds:>10,.0f}"
            )


if __name__ == "__main__":
    main()
