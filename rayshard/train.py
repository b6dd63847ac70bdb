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
import logging
import os
from typing import Any

from rayshard.core.state import loader_name
from rayshard.core.state_file import STATE_FILE, atomic_write, read_state_json, state_file_name
from rayshard.runtime.iterator import ShardIterator

log = logging.getLogger(__name__)

# Loader ids this worker process resumed already: Ray Train's `get_checkpoint()` is the
# latest checkpoint this worker reported, so a later `iterator()` that restored from it
# would rewind the loader to it (a loop taking an iterator per epoch re-read epoch 0).
_RESUMED: set[str] = set()


def iterator(
    loader: Any,
    *,
    batch_format: str = "torch",
    device: Any = None,
    collate_fn: Any = None,
    state_name: str | None = None,
) -> ShardIterator:
    """This Train worker's iterator. A loader's first in a worker process resumes from the
    run's latest checkpoint if it has this loader's state (`state_name`: as `save_state`
    wrote it); later ones go on where the loader is.

    Rank and world size come from the Train context; `device` defaults to Ray Train's
    device for this worker (`ray.train.torch.get_device()`).
    """
    if device is None and batch_format == "torch":
        device = _train_device()
    batches = loader.iterator(batch_format=batch_format, device=device, collate_fn=collate_fn)
    if loader.loader_id not in _RESUMED:
        restore(batches, name=state_name)
        _RESUMED.add(loader.loader_id)
    return batches


def save_state(
    batches: ShardIterator, directory: str | os.PathLike, *, name: str | None = None
) -> dict:
    """Write the loader-wide state (what the model received) into a checkpoint folder,
    atomically: a crash leaves the folder's old state file or the new one, never half.
    Several loaders share a checkpoint under different `name`s (`rayshard_state.NAME.json`;
    without one, `rayshard_state.json`)."""
    state = batches.state_dict()
    path = os.path.join(directory, state_file_name(name))
    atomic_write(path, json.dumps(state).encode("utf-8"))
    return state


def restore(batches: ShardIterator, checkpoint: Any = None, *, name: str | None = None) -> bool:
    """Load the loader state saved under `name` from `checkpoint` (default: Ray Train's
    latest). True if found; a state of a loader of another name is left (logged)."""
    if checkpoint is None:
        try:
            from ray import train

            checkpoint = train.get_checkpoint()
        except Exception:  # noqa: BLE001 - outside Ray Train there is no checkpoint
            checkpoint = None
    if checkpoint is None:
        return False
    with checkpoint.as_directory() as directory:
        path = os.path.join(directory, state_file_name(name))
        if not os.path.exists(path):
            return False
        origin = getattr(checkpoint, "path", None)
        where = f" (of checkpoint {origin})" if origin and str(origin) != str(directory) else ""
        fix = f"resume from an earlier checkpoint, or delete this file{where} to start afresh"
        state = read_state_json(path, fix)
        if not _same_name(state.get("loader"), getattr(batches, "loader_id", None)):
            log.warning(
                "%s holds the state of loader %r, not of %r: not restored (save each "
                "loader's state under its own name: save_state(..., name=...))",
                path,
                state.get("loader"),
                batches.loader_id,
            )
            return False
        batches.load_state_dict(state)
    return True


def _same_name(saved: Any, mine: str | None) -> bool:
    """Whether a state's loader id has this loader's name (the fingerprint is checked by
    the load itself, which refuses a changed loader of the same name, naming the change)."""
    if mine is None or not isinstance(saved, str):
        return True  # (the load names what is wrong)
    return loader_name(saved) == loader_name(mine)


def _train_device() -> Any:
    try:
        from ray.train.torch import get_device

        return get_device()
    except Exception:  # noqa: BLE001 - outside Ray Train: stay on the CPU
        return None


__all__ = ["STATE_FILE", "iterator", "restore", "save_state"]
