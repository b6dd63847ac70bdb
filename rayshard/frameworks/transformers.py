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
"""

from __future__ import annotations

from typing import Any

import torch

from rayshard.data.batching import PADDED_KEY
from rayshard.data.columns import MASK_SUFFIX
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
    re-sharding). Other datasets go through the Trainer's own dataloaders. Composes with
    `ray.train.huggingface.transformers.prepare_trainer` (call either first)."""
    base = trainer.__class__

    class RayshardTrainer(base):
        def get_train_dataloader(self) -> torch.utils.data.DataLoader:
            if isinstance(self.train_dataset, IterableAdapter):
                adapter = self.train_dataset
                return dataloader(adapter.iterator, adapter.transform)
            return super().get_train_dataloader()

        def get_eval_dataloader(self, eval_dataset: Any = None) -> torch.utils.data.DataLoader:
            dataset = self.eval_dataset if eval_dataset is None else eval_dataset
            if isinstance(dataset, str):  # a key of a dict of evaluation datasets
                dataset = self.eval_dataset[dataset]
            if isinstance(dataset, IterableAdapter):
                return dataloader(dataset.iterator, dataset.transform)
            return super().get_eval_dataloader(eval_dataset)

    RayshardTrainer.__name__ = RayshardTrainer.__qualname__ = f"Rayshard{base.__name__}"
    trainer.__class__ = RayshardTrainer
    return trainer


__all__ = ["IGNORE_INDEX", "causal_lm_inputs", "prepare_trainer"]
