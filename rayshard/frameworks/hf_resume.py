"""The loader's state in a Hugging Face `Trainer` checkpoint, and the train `DataLoader`
that puts the loader back where the checkpoint's model stood (used by
`rayshard.frameworks.transformers.prepare_trainer`).

Each process writes its own file beside the Trainer's per-process RNG state
(`rng_state_{i}.pth`): `rayshard_state_{process_index}.json`, the iterator's
`state_dict()`. The state is loader-wide (every rank's file says the same once all ranks
took the same steps, which the Trainer's checkpoints are), so a process whose own file is
missing (more processes than when saved) reads process 0's.

On resume the Trainer (transformers 4.57) computes its epoch from `global_step` and would
skip the epoch's first `global_step % steps_per_epoch` batches by reading them
(`accelerate.skip_first_batches`); a loader restored mid-epoch yields only the rest, so
that skip must not apply too: the prepared Trainer sets `ignore_data_skip` for a
`train()` that resumes with a rayshard state. The state is loaded at the Trainer's first
`set_epoch()` call, after it measured an epoch with `len()` (a restored iterator's `len()`
counts the rest of its epoch, as the Trainer's step count for that epoch then must).
Before, every process puts the loader at the start of the checkpoint's epoch
(`epoch_start`, between two `wait_for_everyone()`), so that the Trainer measures a whole
epoch: also with the dataset of an interrupted `train()` (its iterator stopped mid-epoch),
whose loader may have resumed that very epoch before (its plan of the epoch is then the
rest after that resume point). Without a state an iterator stopped mid-epoch is sent back
to that epoch's start (`restart_epoch`) and the loader reads the Trainer's epoch from its
start: it cannot go back to one it finished (a `ConfigError`).
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import torch.utils.data

from rayshard.core.state_file import PROCESS_STATE_FILE, atomic_write, read_state_json
from rayshard.errors import ConfigError

STATE_FILE_PATTERN = PROCESS_STATE_FILE  # in a Trainer checkpoint folder
NOT_RESUMING = object()  # `ResumingDataLoader(resume=...)`: a train() from the start


def state_path(folder: str | os.PathLike, rank: int) -> str:
    """The loader state file of process `rank` in checkpoint `folder`."""
    return os.path.join(folder, STATE_FILE_PATTERN.format(rank=rank))


def save_loader_state(adapter: Any, folder: str | os.PathLike, rank: int) -> dict:
    """Write `adapter.state_dict()` (what the model received) into checkpoint `folder` as
    process `rank`'s file, atomically. Every process must call it at the same step."""
    state = adapter.state_dict()
    atomic_write(state_path(folder, rank), json.dumps(state).encode("utf-8"))
    return state


def find_loader_state(folder: str | os.PathLike, rank: int) -> dict | None:
    """Process `rank`'s loader state in checkpoint `folder` (process 0's if it has none),
    or None if the checkpoint carries none."""
    for path in (state_path(folder, rank), state_path(folder, 0)):
        if os.path.exists(path):
            fix = (
                "resume from another checkpoint, or delete the rayshard_state_*.json files of"
                f" {folder} to resume the loader by the Trainer's own batch skipping"
            )
            return read_state_json(path, fix)
    return None


def epoch_start(state: dict) -> dict:
    """`state` (a loader state) moved back to the start of its epoch: nothing consumed."""
    return {**state, "consumed": [], "partial": []}


def check_exact_length(iterator: Any, framework: str) -> None:
    """A `ConfigError` if the begun epoch's `len()` is an estimate (`dynamic` with
    `equal_steps=False`): `framework` ends an epoch at `len()`, so an estimate would end it
    early, or leave the next epoch empty (its rest counted as that epoch)."""
    stats = iterator.stats() if hasattr(iterator, "stats") else {}
    if stats.get("length_exact", True) is False:
        raise ConfigError(
            f"{framework} ends each epoch at len(), and this loader's len() is an estimate "
            "(policy='dynamic' with equal_steps=False): its epochs would end early or come "
            "out empty. Use equal_steps=True (the default) or a static policy, or iterate "
            "the iterator yourself to its end"
        )


def restart_epoch(iterator: Any) -> None:
    """Make `iterator`, if stopped mid-epoch (a `train()` or an evaluation interrupted, and
    the dataset used again), read that epoch from its start: on resume the Trainer measures
    an epoch by `len()`, which would count only the epoch's rest (and the Trainer's step
    budget with it), then the checkpoint's state, or the Trainer's skip, says where to go
    on; an evaluation reads a whole epoch, not the rest of an interrupted one."""
    stats = iterator.stats() if hasattr(iterator, "stats") else None  # or a list of batches
    if stats and stats["batches_received"] and iterator.epoch == stats["epoch"]:
        iterator.set_epoch(iterator.epoch)


class ResumingDataLoader(torch.utils.data.DataLoader):
    """`DataLoader(adapter, batch_size=None)` with the `set_epoch()` the Trainer calls at
    every epoch's start. In a resumed `train()` its first call restores `resume` (a
    loader state), or without one makes the iterator read the Trainer's epoch from its
    start (for the Trainer's own skip of the batches had); later calls change nothing,
    the iterator moves to the next epoch by itself."""

    def __init__(self, adapter: Any, resume: Any = NOT_RESUMING) -> None:
        super().__init__(adapter, batch_size=None)
        self.resume = resume

    def __iter__(self) -> Any:
        batches = super().__iter__()  # (the adapter's iterator begins its epoch here)
        check_exact_length(self.dataset.iterator, "the Hugging Face Trainer")
        return batches

    def set_epoch(self, epoch: int) -> None:
        resume, self.resume = self.resume, NOT_RESUMING
        if resume is NOT_RESUMING:
            return
        iterator = self.dataset.iterator
        if resume is None:
            if iterator.epoch > epoch:
                raise ConfigError(
                    f"the checkpoint has no rayshard loader state, and the Trainer resumes its"
                    f" epoch {epoch} by reading it from its start, but this loader is past it"
                    f" (at data epoch {iterator.epoch}): it cannot read an epoch again without a"
                    " state. Resume with a new loader (a new job, or another namespace), or"
                    " from a checkpoint saved by a Trainer prepared with prepare_trainer"
                )
            if iterator.epoch != epoch:
                iterator.set_epoch(epoch)
            return
        self.dataset.load_state_dict(resume)
        if iterator.epoch != epoch:
            warnings.warn(
                f"the checkpoint's loader state resumes data epoch {iterator.epoch} while the"
                f" Trainer resumes its epoch {epoch} (its batch count per epoch differs from"
                " the loader's, e.g. another world size): the data follows the loader's epoch",
                stacklevel=2,
            )


__all__ = [
    "NOT_RESUMING",
    "STATE_FILE_PATTERN",
    "ResumingDataLoader",
    "check_exact_length",
    "find_loader_state",
    "epoch_start",
    "restart_epoch",
    "save_loader_state",
    "state_path",
]
