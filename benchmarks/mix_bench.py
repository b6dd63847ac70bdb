"""`python -m benchmarks.mix_bench`: the cost of mixing, in one process, without Ray.

Two generated Parquet sources (an int64 id and a 16-float feature; row groups of 64k).
Reads one epoch of each through `ParquetSource.read` in `split_rows` pieces and in whole
row groups (the baselines),
then one epoch of a `MixedSource` over them with weights 0.7/0.3 and `samples_per_epoch`
equal to their total rows (so one source is upsampled, the other downsampled), in the same
pieces through `for_epoch(...).read`; and the pure `Mix.locate` alone. Prints rows/s.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rayshard.sources.mixed import MixedSource
from rayshard.sources.parquet import ParquetSource


def write(folder: str, rows: int) -> str:
    os.makedirs(folder)
    ids = np.arange(rows, dtype=np.int64)
    feature = pa.FixedSizeListArray.from_arrays(pa.array(np.random.rand(rows * 16)), 16)
    pq.write_table(
        pa.table({"id": ids, "x": feature}), f"{folder}/p.parquet", row_group_size=1 << 16
    )
    return folder


def epoch(read, total: int, piece: int) -> float:
    started = time.perf_counter()
    rows = sum(b.num_rows for a in range(0, total, piece) for b in read(a, min(a + piece, total)))
    assert rows == total
    return total / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs=2, default=[600_000, 400_000])
    parser.add_argument("--split-rows", type=int, default=8192)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        sources = [ParquetSource(write(f"{root}/{i}", n)) for i, n in enumerate(args.rows)]
        for piece in (args.split_rows, 1 << 16):  # pieces, or whole row groups
            times = sum(n / epoch(s.read, n, piece) for s, n in zip(sources, args.rows))
            print(f"plain sources, pieces of {piece}: {sum(args.rows) / times:,.0f} rows/s")
        mix = MixedSource(sources, [0.7, 0.3], split_rows=args.split_rows)
        total = mix.layout().num_samples
        print(f"mix counts {mix.counts} of sizes {mix.sizes}")
        for e in range(2):  # epoch 0 draws the remainder subsets; epoch 1 again (new ones)
            rate = epoch(mix.for_epoch(e, 0).read, total, args.split_rows)
            print(f"mixed epoch {e}: {rate:,.0f} rows/s")
        arith = mix.mix(0)
        started = time.perf_counter()
        for a in range(0, total, args.split_rows):
            arith.locate(2, a, min(a + args.split_rows, total))
        print(f"Mix.locate alone: {total / (time.perf_counter() - started):,.0f} positions/s")


if __name__ == "__main__":
    main()
