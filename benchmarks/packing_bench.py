"""Benchmark of online packing: packed tokens/s through rayshard against raw tokens/s of
reading the same column with pyarrow, on 2 ranks, and the padding each way of batching
leaves.

    python -m benchmarks.packing_bench [--docs N] [--seq-len S] [--epochs E] [--out DIR]

Data: N documents (default 40,000) with lengths drawn from a log-normal (median about
S/4), clipped to [1, S], as a `tokens` list<int32> column in 4 Parquet files (row groups
of 2,000 rows), written to a temp folder.

- raw: 2 threads of the driver, each reading half the files with
  `pyarrow.parquet.ParquetFile.iter_batches(columns=["tokens"])` and touching every token
  (the values as numpy, summed): the price of the bytes alone, no packing, no batching.
- rayshard split / no-split: `Loader(packing=Packing(column="tokens", seq_len=S,
  split_documents=...), batch_size=16)`, 2 ranks consumed by 2 threads of the driver
  (`batch_format="numpy"`), E epochs (default 3; the first includes the readers' start).
  Tokens/s counts real (masked-in) tokens, over the mean of epochs 2..E. Every epoch is
  checked: every token of every document delivered exactly once (per-document token
  counts and the sum of the mask).

Padding fraction = padding tokens / all tokens of the rows: for the packed runs as
measured (padding rows for equal steps included), and, computed from the same lengths,
for two naive ways: every document in its own row of S tokens (`naive_row`), and batches
of 16 documents padded to the batch's longest (`naive_batch`).

The machine is shared: compare the ratios of one run, not absolute numbers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._measure import format_table
from benchmarks._report import ROOT, start_local_ray, write_json

FILES = 4
ROW_GROUP = 2_000
BATCH_SIZE = 16
WORLD = 2
DEFAULT_OUT = ROOT / "benchmarks" / "results"
TABLE = [
    ("run", "run", "s"),
    ("epoch s", "epoch_s", ".2f"),
    ("Mtokens/s", "mtokens_per_s", ".2f"),
    ("vs raw", "vs_raw", ".2f"),
    ("rows", "rows", "d"),
    ("padding", "padding_fraction", ".3f"),
    ("exact", "exact", "s"),
]


def write_data(folder: Path, docs: int, seq_len: int, seed: int = 0) -> np.ndarray:
    """The documents' lengths; files `part-*.parquet` in `folder`."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(seq_len / 4), 0.8, docs), 1, seq_len).astype(int)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = pa.array(np.arange(offsets[-1], dtype=np.int64).astype(np.int32))
    tokens = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
    bounds = np.linspace(0, docs, FILES + 1).astype(int)
    for f, (a, b) in enumerate(zip(bounds, bounds[1:])):
        table = pa.table({"tokens": tokens.slice(a, b - a)})
        pq.write_table(table, folder / f"part-{f}.parquet", row_group_size=ROW_GROUP)
    return lengths


def raw_epoch(folder: Path) -> tuple[float, int]:
    """Seconds and tokens of reading the column with pyarrow in WORLD threads."""
    files = sorted(folder.glob("*.parquet"))
    totals = [0] * WORLD

    def read(rank: int) -> None:
        for path in files[rank::WORLD]:
            for batch in pq.ParquetFile(path).iter_batches(columns=["tokens"]):
                values = batch.column(0).flatten().to_numpy()
                totals[rank] += int(values.size) + 0 * int(values.sum())

    start = time.perf_counter()
    threads = [threading.Thread(target=read, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, sum(totals)


def packed_epochs(folder: Path, lengths: np.ndarray, seq_len: int, split: bool, epochs: int):
    """Per epoch: seconds, real tokens, rows, padding tokens, exactness."""
    from rayshard.data.packing import Packing
    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    packing = Packing(column="tokens", seq_len=seq_len, split_documents=split)
    name = f"packing-bench-{'split' if split else 'nosplit'}"
    loader = Loader(ParquetSource(str(folder)), batch_size=BATCH_SIZE, name=name, packing=packing)
    its = [loader.iterator(world_rank=r, world_size=WORLD, batch_format="numpy") for r in range(2)]
    out = []
    for _ in range(epochs):
        seen: list[list] = [[] for _ in range(WORLD)]  # per rank: document ids of real tokens
        rows = [0] * WORLD
        start = time.perf_counter()
        threads = [
            threading.Thread(target=_consume, args=(its[r], seen[r], rows, r)) for r in range(WORLD)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - start
        got = np.bincount(np.concatenate([d for s in seen for d in s]), minlength=len(lengths))
        real = int(got.sum())
        out.append(
            {
                "seconds": seconds,
                "tokens": real,
                "rows": sum(rows),
                "padding_fraction": 1 - real / (sum(rows) * seq_len),
                "exact": bool((got == lengths).all()),
            }
        )
    loader.shutdown()
    return out


def _consume(iterator, seen: list, rows: list, rank: int) -> None:
    for batch in iterator:
        seen.append(batch["document_ids"][batch["mask"]])
        rows[rank] += len(batch["mask"])


def naive_padding(lengths: np.ndarray, seq_len: int) -> dict:
    total = int(lengths.sum())
    per_batch = [
        len(chunk) * int(chunk.max()) for chunk in np.array_split(lengths, -(-len(lengths) // 16))
    ]
    return {
        "naive_row": 1 - total / (len(lengths) * seq_len),
        "naive_batch": 1 - total / sum(per_batch),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.packing_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--docs", type=int, default=40_000, help="documents to write")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per packed row")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per packed run (>= 2)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the JSON")
    parser.add_argument("--ray-cpus", type=int, default=2, help="logical CPUs for ray.init")
    args = parser.parse_args(argv)
    for option, value, low in (
        ("--docs", args.docs, FILES),
        ("--seq-len", args.seq_len, 8),
        ("--epochs", args.epochs, 2),
    ):
        if value < low:
            parser.error(f"Invalid value for '{option}': {value} is not in the range x>={low}.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    begun = time.time()
    with tempfile.TemporaryDirectory(prefix="rayshard-packing-bench-") as tmp:
        folder = Path(tmp)
        lengths = write_data(folder, args.docs, args.seq_len)
        total = int(lengths.sum())
        print(
            f"packing bench: {args.docs:,} documents, {total:,} tokens (mean "
            f"{lengths.mean():.0f}), seq_len {args.seq_len}, batch {BATCH_SIZE} rows, "
            f"{WORLD} ranks, {args.epochs} epochs",
            flush=True,
        )
        raw = [raw_epoch(folder) for _ in range(args.epochs)]
        start_local_ray(args.ray_cpus, "rayshard-packing-bench")
        runs = {
            "split": packed_epochs(folder, lengths, args.seq_len, True, args.epochs),
            "no-split": packed_epochs(folder, lengths, args.seq_len, False, args.epochs),
        }
    raw_s = float(np.mean([s for s, _ in raw[1:]]))
    table = [
        {
            "run": "raw pyarrow",
            "epoch_s": raw_s,
            "mtokens_per_s": total / raw_s / 1e6,
            "vs_raw": 1.0,
            "exact": "yes" if all(n == total for _, n in raw) else "NO",
        }
    ]
    for name, epochs in runs.items():
        warm = float(np.mean([e["seconds"] for e in epochs[1:]]))
        table.append(
            {
                "run": f"rayshard {name}",
                "epoch_s": warm,
                "mtokens_per_s": total / warm / 1e6,
                "vs_raw": raw_s / warm,
                "rows": epochs[-1]["rows"],
                "padding_fraction": epochs[-1]["padding_fraction"],
                "exact": "yes" if all(e["exact"] for e in epochs) else "NO",
            }
        )
    naive = naive_padding(lengths, args.seq_len)
    table += [{"run": k, "padding_fraction": v} for k, v in naive.items()]
    print(format_table(table, TABLE))
    checks = {"every_epoch_exact": all(row.get("exact") != "NO" for row in table)}
    report = {
        "config": {
            "docs": args.docs,
            "tokens": total,
            "seq_len": args.seq_len,
            "batch_size": BATCH_SIZE,
            "world_size": WORLD,
            "epochs": args.epochs,
            "files": FILES,
            "row_group_rows": ROW_GROUP,
            "ray_cpus": args.ray_cpus,
        },
        "table": table,
        "runs": runs,
        "raw_epochs_s": [s for s, _ in raw],
        "naive_padding": naive,
        "checks": checks,
        "total_s": time.time() - begun,
    }
    write_json(args.out / "packing_bench.json", report)
    import ray

    if ray.is_initialized():
        ray.shutdown()
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main"]
