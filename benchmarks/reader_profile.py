"""Where a rayshard reader's time goes, stage by stage, in one process (with `--ray`, a
local Ray's object store for put/get): Parquet read -> rebatch to numpy -> ray.put of
blocks of 16 batches -> ray.get. Each stage adds to the one before; best of 3 runs.

    python -m benchmarks.reader_profile [ROWS] [--ray]

Data: the loader benchmark's Parquet (generated under /tmp/rs_prof_data). Ends with a
cProfile of the last stage.
"""

import cProfile
import pstats
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks.loaders.data import BATCH_SIZE, COLUMNS, make_dataset, parquet_files
from rayshard.data.batching import iter_rows
from rayshard.data.reading_order import reading_pieces
from rayshard.runtime.pipeline import reader_batches
from rayshard.sources.parquet import ParquetSource

if {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)
    sys.exit(0)
rows = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 400_000
folder = make_dataset(Path("/tmp/rs_prof_data"), rows)
paths = parquet_files(folder)
src = ParquetSource(paths, columns=COLUMNS)
pieces = reading_pieces([(0, rows)], src.splits(), shuffle=False, rng_key="")


def raw_iter_batches():
    n = 0
    for p in paths:
        for b in pq.ParquetFile(p).iter_batches(batch_size=BATCH_SIZE, columns=COLUMNS):
            b.column("x").values.to_numpy().reshape(-1, 128)
            n += b.num_rows
    return n


def raw_read_row_group():
    n = 0
    for p in paths:
        f = pq.ParquetFile(p)
        for g in range(f.num_row_groups):
            t = f.read_row_group(g, columns=COLUMNS)
            n += t.num_rows
    return n


def source_read():
    return sum(b.num_rows for b in iter_rows(src, pieces, COLUMNS))


def batches():
    return reader_batches(
        iter_rows(src, pieces, COLUMNS),
        batch_size=BATCH_SIZE,
        rules=None,
        transform=None,
        workers=None,
        loader="x",
        seed=0,
        epoch=0,
        rank=0,
    )


def pipeline():
    return sum(len(b["_index"]) for b in batches())


def put_get(get=True):
    import ray

    n = 0
    block = []
    for b in batches():
        n += len(b["_index"])
        block.append(b)
        if len(block) >= 16:
            ref = ray.put(block)
            block = []
            if get:
                ray.get(ref)
            del ref
    return n


stages = [
    ("raw iter_batches (1024) + x to numpy", raw_iter_batches),
    ("raw read_row_group", raw_read_row_group),
    ("source.read (rayshard ParquetSource)", source_read),
    ("+ rebatch to numpy dicts", pipeline),
]
if "--ray" in sys.argv:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    stages += [
        ("+ ray.put blocks of 16", lambda: put_get(False)),
        ("+ ray.get of each block", put_get),
    ]
for name, f in stages:
    f()
    best = 0
    for _ in range(3):
        t = time.perf_counter()
        n = f()
        best = max(best, n / (time.perf_counter() - t))
    print(f"{name:<42} {best:>12,.0f} rows/s", flush=True)
cProfile.run("put_get()" if "--ray" in sys.argv else "pipeline()", "/tmp/rs_prof.out")
pstats.Stats("/tmp/rs_prof.out").sort_stats("tottime").print_stats(12)
