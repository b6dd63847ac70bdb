"""PyTorch Lightning: a rayshard iterator for `trainer.fit`, its state in Lightning's own
checkpoint.

    batches = LightningBatches(rayshard.train.iterator(loader))
    trainer = pl.Trainer(..., callbacks=[RayshardCheckpoint(batches)])
    trainer.fit(model, train_dataloaders=batches, ckpt_path=...)

A bare `ShardIterator` works for `fit` (Lightning stops each epoch at `len()`, which ends
the epoch), but Lightning's own handling of an iterable's `state_dict()` does not
resume it (lightning 2.6): it saves the state (`FitLoop.on_save_checkpoint`) but loads it
only when `fit_loop.restarting`, which its setter turns off when the checkpoint was taken
after an epoch's last batch (`RayTrainReportCallback` saves there); and mid-epoch it
expects `len()` to be the whole epoch's batch count while the loader yields only the rest,
but a `ShardIterator`'s `len()` counts the batches still to come, so the resumed epoch would
end early. Hence `LightningBatches` (whole-epoch `len()`) and `RayshardCheckpoint` (saves
and loads the state through the callback hooks, which run for every checkpoint).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl

from rayshard.frameworks.hf_resume import check_exact_length, restart_epoch

CHECKPOINT_KEY = "rayshard"  # the key of the loader state in a Lightning checkpoint
VAL_CHECKPOINT_KEY = "rayshard_val"  # and of the validation loader's


class LightningBatches:
    """A `ShardIterator` as Lightning counts it: `len()` is the whole current epoch (the
    batches this rank already had, also before a restored checkpoint, plus those to come).
    Its state travels through `RayshardCheckpoint`; `state_dict()`/`load_state_dict()` are
    empty on purpose (Lightning's own path, see the module docstring), present so that
    Lightning does not warn that the loader cannot resume mid-epoch."""

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator
        self._epoch: int | None = None  # the epoch `_yielded` counts
        self._yielded = 0  # batches of `_epoch` yielded on this rank (restored on resume)

    def __iter__(self) -> Iterator[Any]:
        """The current epoch's batches; the epoch is decided at the first `next()`, not at
        `iter()`: Lightning calls `iter()` once to check the iterable before it loads a
        checkpoint, and an epoch begun then would be stale after a Ray Train restart."""
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        batches = iter(self.iterator)  # decides the epoch
        check_exact_length(self.iterator, "Lightning")
        epoch = self.iterator.epoch
        if epoch != self._epoch:
            self._epoch, self._yielded = epoch, 0
        for batch in batches:
            if self._epoch == epoch:
                self._yielded += 1
            yield batch

    def __len__(self) -> int:
        remaining = len(self.iterator)
        return self._yielded + remaining if self._in_epoch() else remaining

    def _in_epoch(self) -> bool:
        return self._epoch is not None and self.iterator.epoch == self._epoch

    @property
    def epoch(self) -> int:
        """The epoch the current (or, once it is finished, the next) iteration reads."""
        return self.iterator.epoch

    def state_dict(self) -> dict:
        """Empty: `RayshardCheckpoint` carries the state (see the class docstring)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """A no-op: `RayshardCheckpoint` restores the state (see the class docstring)."""

    def snapshot(self) -> dict:
        """The loader's state (what the model received) and this rank's batch count in the
        unfinished epoch (0 at an epoch boundary). JSON-safe."""
        return {
            "loader": self.iterator.state_dict(),
            "batches": self._yielded if self._in_epoch() else 0,
        }

    def restore(self, snapshot: dict) -> None:
        """Resume where `snapshot` was taken; `len()` counts the batches had before it."""
        if not isinstance(snapshot, dict) or "loader" not in snapshot:
            found = sorted(snapshot) if isinstance(snapshot, dict) else type(snapshot).__name__
            raise ValueError(
                f"not a LightningBatches snapshot (found {found}): expected the dict that"
                " LightningBatches.snapshot() returns, with keys 'loader' and 'batches'"
            )
        self.iterator.load_state_dict(snapshot["loader"])
        self._epoch, self._yielded = self.iterator.epoch, int(snapshot.get("batches", 0))


class RayshardCheckpoint(pl.Callback):
    """Puts `batches.snapshot()` into every Lightning checkpoint (key `"rayshard"`) and
    restores it when Lightning loads one (`ckpt_path=`), on every rank: the loader goes on
    exactly where the model stood, mid-epoch or at an epoch boundary. It also sets the
    trainer's `reload_dataloaders_every_n_epochs` to 1, so every epoch is as long as
    `len()` says (Lightning keeps the first epoch's length otherwise).

    `val`: the validation `ShardIterator`, if any. Its state (the next validation epoch) is
    saved and restored too: after a Ray Train restart a new validation iterator would
    otherwise ask for epoch 0, which the loader refuses as stale."""

    def __init__(self, batches: LightningBatches, val: Any = None) -> None:
        if not isinstance(batches, LightningBatches):
            raise TypeError(
                f"RayshardCheckpoint needs the LightningBatches passed to trainer.fit, got "
                f"{type(batches).__name__}: wrap the iterator, LightningBatches(iterator)"
            )
        self.batches, self.val = batches, val

    def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        """Make Lightning ask `len()` again every epoch: it keeps the first epoch's length
        as a limit otherwise (`reload_dataloaders_every_n_epochs=0`), and an epoch whose
        batch count differs (shards of other sizes, a resume on another world size) would
        end early or spill into the next one."""
        if trainer.reload_dataloaders_every_n_epochs != 1:
            trainer.reload_dataloaders_every_n_epochs = 1

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        """A validation cut short (the sanity check's batches, `limit_val_batches`) leaves
        the validation iterator mid-epoch: the next one would read only the rest, and its
        `len()` (which Lightning takes as the epoch's) shrink every time. It reads that
        epoch from its start again instead; a whole validation moves on to the next."""
        if isinstance(self.val, LightningBatches):  # its count of the epoch starts over too
            restart_epoch(self.val.iterator)
            self.val._epoch, self.val._yielded = None, 0
        elif self.val is not None:
            restart_epoch(self.val)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = self.batches.snapshot()
        if self.val is not None:
            checkpoint[VAL_CHECKPOINT_KEY] = self.val.state_dict()

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict) -> None:
        snapshot = checkpoint.get(CHECKPOINT_KEY)
        if snapshot is None:
            warnings.warn(
                "the Lightning checkpoint has no rayshard state (it was not written with"
                " RayshardCheckpoint): the loader starts from its own position, not the model's",
                stacklevel=2,
            )
            return
        self.batches.restore(snapshot)
        if self.val is not None and VAL_CHECKPOINT_KEY in checkpoint:
            self.val.load_state_dict(checkpoint[VAL_CHECKPOINT_KEY])


__all__ = ["CHECKPOINT_KEY", "VAL_CHECKPOINT_KEY", "LightningBatches", "RayshardCheckpoint"]
