"""Hugging Face `transformers.Trainer` over rayshard.

    batches = rayshard.train.iterator(loader)               # token rows, batched per rank
    trainer = Trainer(model=model, args=args,
                      train_dataset=IterableAdapter(batches, transform=causal_lm_inputs))
    trainer = rayshard.frameworks.transformers.prepare_trainer(ray_prepare_trainer(trainer))
    trainer.train()

`prepare_trainer` makes the `Trainer` read an `IterableAdapter` train dataset through
`DataLoader(adapter, batch_size=None)`: batches pass through as rayshard made them and are
not handed to Accelerate's `prepare()`, which would split each rank's batches over the
ranks again. `len()` is the rank's exact batch count per epoch, so `num_train_epochs` and
`max_steps` both hold; each epoch the Trainer stops at `len()`, which ends the epoch.

Resume: every checkpoint the prepared Trainer saves carries each process's loader state
(`rayshard_state_{process_index}.json`, beside its RNG state), and
`trainer.train(resume_from_checkpoint=...)` puts the loader back where the checkpoint's
model stood, mid-epoch or at an epoch's end, in place of the Trainer's own skipping of the
batches had (see `rayshard.frameworks.hf_resume`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from rayshard.data.batching import PADDED_KEY
from rayshard.data.columns import MASK_SUFFIX
from rayshard.frameworks.hf_resume import (
    NOT_RESUMING,
    ResumingDataLoader,
    epoch_start,
    find_loader_state,
    restart_epoch,
    save_loader_state,
)
from rayshard.frameworks.torch import IterableAdapter, dataloader

IGNORE_INDEX = -100  # the label transformers' losses ignore


def causal_lm_inputs(batch: dict, column: str = "input_ids") -> dict:
    """A rayshard batch of token rows as a causal LM's inputs: `input_ids`, an
    `attention_mask` and `labels` = `input_ids` with every token that is not real set to
    -100 (no loss, no token count): padding rows, and the padded tail of a row where the
    batch marks its real tokens (`{column}_mask` of a `Padding` rule, or packing's `mask`).
    The mask is the attention mask (ones without one); `_index`, `_padded` and other
    columns are dropped."""
    input_ids = batch[column]
    mask = batch.get(column + MASK_SUFFIX, batch.get("mask"))
    labels = input_ids.clone()
    labels[batch[PADDED_KEY]] = IGNORE_INDEX
    if mask is None:
        attention_mask = torch.ones_like(input_ids)
    else:
        labels[~mask.bool()] = IGNORE_INDEX
        attention_mask = mask.to(input_ids.dtype)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def prepare_trainer(trainer: Any) -> Any:
    """Make `trainer` read `IterableAdapter` train and evaluation datasets as they are (one
    batch per step, no re-batching to `per_device_eval_batch_size`, no Accelerate
    re-sharding), save the train loader's state in every checkpoint and restore it on
    `train(resume_from_checkpoint=...)`. Other datasets go through the Trainer's own
    dataloaders. Composes with `ray.train.huggingface.transformers.prepare_trainer` (call
    either first)."""
    base = trainer.__class__

    class RayshardTrainer(base):
        _rayshard_resume: Any = NOT_RESUMING  # what the next train dataloader resumes

        def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
            folder = _checkpoint_folder(resume_from_checkpoint, self.args.output_dir)
            if folder is None or not isinstance(self.train_dataset, IterableAdapter):
                return super().train(resume_from_checkpoint, *args, **kwargs)
            state = find_loader_state(folder, self.args.process_index)
            if state is None:
                warnings.warn(
                    f"checkpoint {folder} has no rayshard loader state (not saved by a"
                    " Trainer prepared with rayshard's prepare_trainer, or saved with"
                    " save_only_model=True, which saves no data state): the loader reads the"
                    " Trainer's epoch again from its start and the Trainer skips the batches"
                    " had, which repeats no sample only if that epoch's plan is the same",
                    stacklevel=2,
                )
                restart_epoch(self.train_dataset.iterator)
            else:  # a whole epoch's len() even where this loader resumed that epoch before
                self.accelerator.wait_for_everyone()  # all made their Trainer (it asks len())
                self.train_dataset.load_state_dict(epoch_start(state))
                self.accelerator.wait_for_everyone()  # none loads the state before all did
            skip = self.args.ignore_data_skip
            self.args.ignore_data_skip = skip or state is not None  # the loader resumes
            self._rayshard_resume = state
            try:
                return super().train(resume_from_checkpoint, *args, **kwargs)
            finally:
                self.args.ignore_data_skip = skip
                self._rayshard_resume = NOT_RESUMING

        def get_train_dataloader(self) -> torch.utils.data.DataLoader:
            if isinstance(self.train_dataset, IterableAdapter):
                adapter = self.train_dataset
                return ResumingDataLoader(
                    IterableAdapter(adapter.iterator, adapter.transform), self._rayshard_resume
                )
            return super().get_train_dataloader()

        def _save_rng_state(self, output_dir: str) -> None:
            """Each process's loader state goes where its RNG state does (every process
            saves this at the same step, as `state_dict()` needs). No process reads its
            next batch before every process took its state: the Trainer has no barrier
            there, and a state taken after another process's next batch (process 0 still
            saving the model) would count that batch consumed."""
            super()._save_rng_state(output_dir)
            if isinstance(self.train_dataset, IterableAdapter):
                save_loader_state(self.train_dataset, output_dir, self.args.process_index)
                self.accelerator.wait_for_everyone()

        def get_eval_dataloader(self, eval_dataset: Any = None) -> torch.utils.data.DataLoader:
            dataset = self.eval_dataset if eval_dataset is None else eval_dataset
            if isinstance(dataset, str):  # a key of a dict of evaluation datasets
                dataset = self.eval_dataset[dataset]
            if isinstance(dataset, IterableAdapter):
                restart_epoch(dataset.iterator)  # an interrupted evaluation's: read it whole
                return dataloader(dataset.iterator, dataset.transform)
            return super().get_eval_dataloader(eval_dataset)

    RayshardTrainer.__name__ = RayshardTrainer.__qualname__ = f"Rayshard{base.__name__}"
    trainer.__class__ = RayshardTrainer
    return trainer


def _checkpoint_folder(resume_from_checkpoint: Any, output_dir: str) -> str | None:
    """The folder `Trainer.train(resume_from_checkpoint=...)` resumes from, or None: True
    means the last checkpoint in `output_dir` (None if there is none: the Trainer raises)."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True:
        from transformers.trainer_utils import get_last_checkpoint

        return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    return os.fspath(resume_from_checkpoint)


__all__ = ["IGNORE_INDEX", "causal_lm_inputs", "prepare_trainer"]
