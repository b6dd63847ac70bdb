"""Transforms the Ray tests use, in a module the reader actors can import by name."""

from __future__ import annotations

import os

import numpy as np

from rayshard.data.transforms import keep_rows


def noisy(batch, ctx):
    """Per-sample random values, the reader's pid and what the columns arrived as."""
    assert isinstance(batch["text"], list) and isinstance(batch["blob"], list)
    return {
        "id": batch["id"],
        "noise": np.array([ctx.rng(row).random() for row in range(len(ctx))]),
        "pid": np.full(len(ctx), os.getpid()),
        "text_ok": np.array([t == f"sample-{i}" for t, i in zip(batch["text"], batch["id"])]),
        "blob_len": np.array([len(b) for b in batch["blob"]]),
    }


def drop_thirds(batch, ctx):
    """A filter: every sample whose index is a multiple of 3 is dropped."""
    return keep_rows(batch, ctx.indices % 3 != 0)


def slow_noisy(batch, ctx):
    """`noisy` that takes a while per batch (time to kill a worker mid-epoch)."""
    import time

    time.sleep(0.03)
    return noisy(batch, ctx)


def drop_below_16(batch, ctx):
    """A filter that empties the first batches of rank 0 (batch size 8)."""
    numeric = {k: batch[k] for k in ("id", "_index", "_padded")}  # torch takes numbers
    return keep_rows(numeric, ctx.indices >= 16)


def identity(batch, ctx):
    """Every column as it came: the batches must equal the loader's without a transform."""
    return dict(batch)


def keep_below_4(sample, rng):
    """A `per_sample` filter: only samples 0..3 are kept (the first batch of 4)."""
    return {"v": sample["id"] * 2} if sample["id"] < 4 else None


def text_objects(batch, ctx):
    """Object arrays of only str and only bytes (shipped as Arrow), one with None and one
    of mixed types (shipped as they are), and a list of bytes."""
    n = len(ctx)
    mixed = np.empty(n, object)
    mixed[:] = [t if i % 2 else t.encode() for i, t in enumerate(batch["text"])]
    holes = np.empty(n, object)
    holes[:] = [None if i % 3 == 0 else t for i, t in enumerate(batch["text"])]
    blob = np.empty(n, object)
    blob[:] = batch["blob"]
    return {
        "id": batch["id"],
        "text": np.array([t + "é" for t in batch["text"]], dtype=object),
        "blob": blob,
        "mixed": mixed,
        "holes": holes,
        "listed": list(batch["blob"]),
    }


def exit_at_42(batch, ctx):
    """Exits on the batch holding sample 42 (a script's `sys.exit()` reached in a transform)."""
    if 42 in ctx.indices:
        raise SystemExit(3)
    return {"id": batch["id"]}
