"""Hugging Face Trainer loops run inside Ray Train workers (importable there as
`tests.frameworks.hf_loops`), and the token data they read."""

from __future__ import annotations

import os
import tempfile
from contextlib import nullcontext

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

VOCAB, SEQ = 64, 16


def write_tokens(folder: str, rows: int, files: int = 2) -> str:
    """Fixed-length int64 `input_ids` rows (a FixedSizeList column); row i starts with
    (i // VOCAB, i % VOCAB), so a training step can tell which rows it received."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        ids = np.arange(lo, hi, dtype=np.int64)
        tokens = rng.integers(0, VOCAB, size=(hi - lo, SEQ), dtype=np.int64)
        tokens[:, 0], tokens[:, 1] = ids // VOCAB, ids % VOCAB
        column = pa.FixedSizeListArray.from_arrays(pa.array(tokens.reshape(-1)), SEQ)
        pq.write_table(
            pa.table({"input_ids": column}),
            os.path.join(folder, f"part-{index}.parquet"),
            row_group_size=32,
        )
    return folder


def row_ids(inputs: dict) -> list[int]:
    """The dataset rows of a causal-LM batch (padding rows, labelled -100, left out)."""
    real = inputs["labels"][:, 0] != -100
    tokens = inputs["input_ids"][real]
    return (tokens[:, 0] * VOCAB + tokens[:, 1]).tolist()


def hf_loop(config: dict) -> None:
    """`hf_train` for each entry of `config["runs"]`, one after the other (one worker group
    start-up for several trainings). Only the first resumes from Ray Train's checkpoint:
    `get_checkpoint()` is the group's latest report, which a later run would take for its
    own (another loader's)."""
    for index, run in enumerate(config["runs"]):
        hf_train({**run, "resume": index == 0})


def hf_train(config: dict) -> None:
    """A tiny GPT-2 (built from a config, no download) trained by `transformers.Trainer`,
    fed by rayshard; every training step's rows go to the audit actor. Resumes from Ray
    Train's latest checkpoint (the Trainer's checkpoint in it, with the loader's state).
    With `then_max_steps`, the Trainer then trains on from its last checkpoint to that
    `max_steps`."""
    from ray.train.huggingface.transformers import RayTrainReportCallback
    from ray.train.huggingface.transformers import prepare_trainer as ray_prepare_trainer
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    import rayshard.train
    from rayshard.frameworks.torch import IterableAdapter
    from rayshard.frameworks.transformers import causal_lm_inputs, prepare_trainer

    audit = config["audit"]

    class RecordingTrainer(Trainer):
        epoch_offset = 0  # added to the audit's epochs: tells a later train()'s steps apart

        def training_step(self, model, inputs, num_items_in_batch=None):
            epoch = int(self.state.epoch) + self.epoch_offset
            ray.get(audit.add.remote(epoch, row_ids(inputs)))
            return super().training_step(model, inputs, num_items_in_batch)

    batches = rayshard.train.iterator(config["loader"])
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=SEQ)
    )
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-"),
        num_train_epochs=config["epochs"],
        max_steps=config.get("max_steps", -1),
        learning_rate=1e-3,
        use_cpu=True,
        save_strategy="epoch",
        report_to=[],
        disable_tqdm=True,
    )
    trainer = RecordingTrainer(
        model=model,
        args=args,
        train_dataset=IterableAdapter(batches, transform=causal_lm_inputs),
        callbacks=[RayTrainReportCallback()],
    )
    trainer = prepare_trainer(ray_prepare_trainer(trainer))
    checkpoint = ray.train.get_checkpoint()
    checkpoint = checkpoint if config.get("resume", True) else None
    with checkpoint.as_directory() if checkpoint else nullcontext() as folder:
        resume = os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME) if folder else None
        trainer.train(resume_from_checkpoint=resume)  # the loader resumes with the model
    if config.get("then_max_steps"):
        # train() again, to a larger max_steps, from the checkpoint the first one reported
        # last, with the same dataset (as in a notebook); its steps audited as epoch + 10.
        trainer.args.max_steps = config["then_max_steps"]
        trainer.epoch_offset = 10
        with ray.train.get_checkpoint().as_directory() as folder:
            last = os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.train(resume_from_checkpoint=last)
