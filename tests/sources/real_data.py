"""Parquet files as other tools write them (polars, duckdb, pandas, fastparquet), and a
helper that runs a real `Loader` epoch on the local Ray."""

from __future__ import annotations

import concurrent.futures
import itertools
import os

import numpy as np
import pyarrow as pa
import torch

_names = itertools.count()


def unique_name(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def token_rows(ids, seed: int = 0) -> list[list[int]]:
    """5-300 tokens per row; token j of sample i is i * 1000 + j (checkable)."""
    rng = np.random.default_rng(seed)
    return [[i * 1000 + j for j in range(int(rng.integers(5, 301)))] for i in ids]


def write_polars(path, ids, row_group_size: int = 16) -> None:
    """`large_list<int32>` tokens, int64 id, string text."""
    import polars as pl

    frame = pl.DataFrame(
        {
            "id": list(ids),
            "tokens": token_rows(ids),
            "text": [f"doc {i}" for i in ids],
        },
        schema={"id": pl.Int64, "tokens": pl.List(pl.Int32), "text": pl.String},
    )
    frame.write_parquet(path, row_group_size=row_group_size)


def write_duckdb(path, ids) -> None:
    """`list<int32>` tokens written by duckdb's COPY ... TO, int32 id (promoted to int64)."""
    import duckdb

    rows = pa.table(  # noqa: F841 - read by duckdb through its name
        {
            "id": pa.array(list(ids), pa.int32()),
            "tokens": pa.array(token_rows(ids), pa.list_(pa.int32())),
            "text": [f"doc {i}" for i in ids],
        }
    )
    con = duckdb.connect()
    con.execute(
        "COPY (SELECT id, tokens::INTEGER[] AS tokens, text FROM rows ORDER BY id) "
        f"TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 16)"
    )
    con.close()


def epoch(loader, world: int = 1, **options) -> list[dict]:
    """Every rank's batches of one epoch, each rank consumed by its own thread (as
    separate workers would; a `dynamic` rank may wait for the others), then the iterators
    are closed. The first error of any rank is raised."""
    its = [loader.iterator(world_rank=r, world_size=world, **options) for r in range(world)]
    with concurrent.futures.ThreadPoolExecutor(world) as pool:
        results = [f.result() for f in [pool.submit(list, it) for it in its]]
    for it in its:
        it.close()
    return [b for batches in results for b in batches]


def indices(batches, key: str = "_index") -> list[int]:
    """Real sample indices of torch or numpy batches."""
    out = []
    for b in batches:
        padded = np.asarray(b["_padded"])
        out += [int(i) for i in np.asarray(b[key])[~padded]]
    return out


class Images:
    """Samples of rank-2 and rank-3 arrays and tensors of one shape."""

    def __len__(self):
        return 26

    def __getitem__(self, i):
        return {
            "img": np.full((2, 3), i, dtype=np.float32),
            "vol": torch.arange(8, dtype=torch.int16).reshape(2, 2, 2) + i,
            "label": i,
        }


class Pairs:
    def __len__(self):
        return 11

    def __getitem__(self, i):
        return torch.full((4,), float(i)), i


class Shapes:
    """Five samples: the probes (0, 2, 4) agree on shape (2, 2), sample 1 does not."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        return {"a": np.zeros((3, 2) if i == 1 else (2, 2), dtype=np.int64)}
