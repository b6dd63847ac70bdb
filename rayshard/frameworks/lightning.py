"""PyTorch Lightning: hand `trainer.fit` a rayshard iterator, resumable from Lightning's
own checkpoint.

    batches = rayshard.frameworks.lightning.LightningBatches(rayshard.train.iterator(loader))
    trainer.fit(model, train_dataloaders=batches, ckpt_path=...)

A bare `ShardIterator` already works for `fit` (Lightning stops each epoch at `len()`,
which ends the epoch, SPEC 14) and for checkpoints taken at the end of an epoch: Lightning
stores the `state_dict()` of every iterable that has one in its checkpoint
(`FitLoop.on_save_checkpoint`, key `loops.fit_loop.state_dict.combined_loader`) and calls
`load_state_dict()` on resume. For a checkpoint taken *mid-epoch* Lightning expects `len()`
to be the whole epoch's batch count while the loader yields only the rest (its batch
counter resumes at the batches already trained), but a `ShardIterator`'s `len()` counts the
batches still to come, so Lightning would end the resumed epoch early. `LightningBatches`
reports the whole epoch and records in the checkpoint how many batches this rank had had.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

STATE_KEY = "rayshard"


class LightningBatches:
    """A `ShardIterator` as Lightning counts it: `len()` is the whole current epoch (batches
    already yielded, also before a restored checkpoint, plus those to come); `state_dict()`
    is the loader's state plus that count. Iterate, `len()` and checkpoint as usual."""

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator
        self._epoch: int | None = None  # the epoch `_yielded` counts
        self._yielded = 0  # batches of `_epoch` yielded on this rank (restored on resume)

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.iterator)  # decides the epoch (SPEC 14)
        if self.iterator.epoch != self._epoch:
            self._epoch, self._yielded = self.iterator.epoch, 0
        return self._count(batches, self._epoch)

    def _count(self, batches: Iterator[Any], epoch: int) -> Iterator[Any]:
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
        """The loader's state (what the model received) and this rank's batch count in the
        unfinished epoch (0 at an epoch boundary)."""
        return {
            STATE_KEY: self.iterator.state_dict(),
            "batches": self._yielded if self._in_epoch() else 0,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume where `state` was saved; `len()` counts the batches had before it."""
        if not isinstance(state, dict) or STATE_KEY not in state:
            found = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"not a LightningBatches state (found {found}):"
                " the checkpoint was written with another train_dataloaders iterable;"
                " pass the same kind of iterable that wrote it"
            )
        self.iterator.load_state_dict(state[STATE_KEY])
        self._epoch, self._yielded = self.iterator.epoch, int(state.get("batches", 0))


__all__ = ["LightningBatches", "STATE_KEY"]
