"""Ray Train glue: one call in `train_loop_per_worker`, and loader state in checkpoints.

def train_loop_per_worker(config):
    batches = rayshard.train.iterator(config["loader"])   # resumes from a checkpoint
    for epoch in range(config["epochs"]):
        for batch in batches:
            ...
        with tempfile.TemporaryDirectory() as d:
            rayshard.train.save_state(batches, d)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
"""

from __future__ import annotations

import json
import os
from typing import Any

from rayshard.core.state_file import STATE_FILE, atomic_write, read_state_json
from rayshard.runtime.iterator import ShardIterator


def iterator(
    loader: Any, *, batch_format: str = "torch", device: Any = None, collate_fn: Any = None
) -> ShardIterator:
    """This Train worker's iterator, resumed from the run's latest checkpoint if it has one.

    Rank and world size come from the Train context; `device` defaults to Ray Train's
    device for this worker (`ray.train.torch.get_device()`).
    """
    if device is None and batch_format == "torch":
        device = _train_device()
    batches = loader.iterator(batch_format=batch_format, device=device, collate_fn=collate_fn)
    restore(batches)
    return batches


def save_state(batches: ShardIterator, directory: str | os.PathLike) -> dict:
    """Write the loader-wide state (what the model received) into a checkpoint folder,
    atomically: a crash leaves the folder's old state file or the new one, never half."""
    state = batches.state_dict()
    atomic_write(os.path.join(directory, STATE_FILE), json.dumps(state).encode("utf-8"))
    return state


def restore(batches: ShardIterator, checkpoint: Any = None) -> bool:
    """Load the loader state from `checkpoint` (default: Ray Train's latest). True if found."""
    if checkpoint is None:
        try:
            from ray import train

            checkpoint = train.get_checkpoint()
        except Exception:  # noqa: BLE001 - outside Ray Train there is no checkpoint
            checkpoint = None
    if checkpoint is None:
        return False
    with checkpoint.as_directory() as directory:
        path = os.path.join(directory, STATE_FILE)
        if not os.path.exists(path):
            return False
        origin = getattr(checkpoint, "path", None)
        where = f" (of checkpoint {origin})" if origin and str(origin) != str(directory) else ""
        fix = f"resume from an earlier checkpoint, or delete this file{where} to start afresh"
        batches.load_state_dict(read_state_json(path, fix))
    return True


def _train_device() -> Any:
    try:
        from ray.train.torch import get_device

        return get_device()
    except Exception:  # noqa: BLE001 - outside Ray Train: stay on the CPU
        return None
