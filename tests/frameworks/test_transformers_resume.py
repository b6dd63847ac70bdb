"""Hugging Face `Trainer.train(resume_from_checkpoint=...)` over rayshard, in one process
(no Ray Train, so it is quick): checkpoints at epoch 0's end and mid-epoch in epoch 1, the
run stopped, then a new loader (as in a new job) and a new Trainer resume from one. Every
epoch is covered exactly once across both runs, and the epochs after the interrupted one
are the loader's own epochs, in the order an uninterrupted run reads them."""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
from typing import Any

import pytest
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from rayshard.errors import ConfigError
from rayshard.frameworks.hf_resume import find_loader_state, state_path
from rayshard.frameworks.torch import IterableAdapter
from rayshard.frameworks.transformers import causal_lm_inputs, prepare_trainer
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.frameworks.hf_loops import SEQ, VOCAB, row_ids, write_tokens
from tests.runtime.helpers import unique_name

pytestmark = pytest.mark.ray

ROWS, BATCH, EPOCHS = 48, 8, 3  # 6 steps per epoch; 6 files, so shuffled epochs differ
STOP = 9  # checkpoints every 3 steps; stopped after step 9: epoch 1, 3 of its 6 batches had


class _Stop(Exception):
    pass


class StopAfterSave(TrainerCallback):
    """Stops the run by raising once the checkpoint of global step `step` is saved."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs) -> None:
        if state.global_step == self.step:
            raise _Stop


class Recorder(Trainer):
    """Records the dataset rows of every training step, per Trainer epoch."""

    seen: list[tuple[int, list[int]]]

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.seen.append((int(self.state.epoch), row_ids(inputs)))
        return super().training_step(model, inputs, num_items_in_batch)


def cpu_args(cls: type, output_dir: str, save_steps: int | None, epochs: int) -> Any:
    """`cls` (`TrainingArguments` or a subclass) for a quiet CPU run of `epochs` epochs,
    saving every `save_steps` steps (never if None)."""
    return cls(
        output_dir=output_dir,
        num_train_epochs=epochs,
        use_cpu=True,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 1,
        report_to=[],
        disable_tqdm=True,
        logging_strategy="no",
    )


def tiny_trainer(cls: type, args: Any, train_dataset: Any, stop: int | None) -> Any:
    """A prepared `cls` Trainer of a 1-layer GPT-2 over `train_dataset`, stopped after the
    save of step `stop` (if given), with an empty `seen` for the ids it trains on."""
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=SEQ)
    )
    callbacks = [StopAfterSave(stop)] if stop else []
    trainer = prepare_trainer(
        cls(model=model, args=args, train_dataset=train_dataset, callbacks=callbacks)
    )
    trainer.seen = []
    return trainer


def _train(
    loader: Loader,
    output_dir: str,
    resume: str | None = None,
    stop: int | None = None,
    batches: IterableAdapter | None = None,
    save_steps: int = 3,
):
    args = cpu_args(TrainingArguments, output_dir, save_steps if stop else None, EPOCHS)
    if batches is None:
        batches = IterableAdapter(loader.iterator(world_rank=0, world_size=1), causal_lm_inputs)
    trainer = tiny_trainer(Recorder, args, batches, stop)
    with contextlib.suppress(_Stop):
        trainer.train(resume_from_checkpoint=resume)
    return trainer


def _epochs(*runs: list[tuple[int, list[int]]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = collections.defaultdict(list)
    for run in runs:
        for epoch, ids in run:
            out[epoch] += ids
    return out


def test_resume_from_a_checkpoint_is_exactly_once(ray_session, tmp_path):
    data = write_tokens(str(tmp_path / "tokens"), ROWS, files=6)
    name = unique_name("hfres")

    def loader() -> Loader:  # a new namespace each time: a fresh loader, as in a new job
        return Loader(
            ParquetSource(data),
            batch_size=BATCH,
            name=name,
            shuffle=True,
            namespace=unique_name("hfres-job"),
        )

    plain = loader()  # what an uninterrupted run reads, epoch by epoch
    iterator = plain.iterator(world_rank=0, world_size=1)
    expected = {e: [i for b in iterator for i in b["_index"].tolist()] for e in range(EPOCHS)}
    plain.shutdown()
    assert expected[0] != expected[1], "the epochs must differ for this test to tell them apart"

    first_loader = loader()
    first = _train(first_loader, str(tmp_path / "first"), stop=STOP)
    first_loader.shutdown()
    checkpoint = str(tmp_path / "first" / f"checkpoint-{STOP}")
    assert os.path.exists(state_path(checkpoint, 0))
    assert [epoch for epoch, _ in first.seen] == [0] * 6 + [1] * 3

    # The same checkpoint without the loader state (as a plain Trainer saves it): the loader
    # reads the Trainer's epoch again and the Trainer skips the batches had.
    bare = str(tmp_path / "bare")
    shutil.copytree(checkpoint, bare)
    os.remove(state_path(bare, 0))
    epoch_end = str(tmp_path / "first" / "checkpoint-6")
    for resume, had in ((checkpoint, first.seen), (bare, first.seen), (epoch_end, first.seen[:6])):
        second_loader = loader()
        warned = pytest.warns(UserWarning, match="no rayshard loader state")
        with warned if resume == bare else contextlib.nullcontext():
            second = _train(second_loader, str(tmp_path / "second"), resume=resume)
        second_loader.shutdown()
        assert second.state.global_step == EPOCHS * 6
        assert not second.args.ignore_data_skip, "the Trainer's own setting is given back"
        got = _epochs(had, second.seen)
        for epoch in range(EPOCHS):
            counts = collections.Counter(got[epoch])
            assert counts == collections.Counter(range(ROWS)), (resume, epoch, got[epoch])
        assert got[2] == expected[2], resume  # an epoch after: the loader's own, in order


def test_a_process_without_its_own_state_file_reads_process_0s(tmp_path):
    """More processes than saved the checkpoint: the state is loader-wide, any file will do."""
    assert find_loader_state(tmp_path, 0) is None
    (tmp_path / "rayshard_state_0.json").write_text('{"version": 1}')
    (tmp_path / "rayshard_state_1.json").write_text('{"version": 1, "rank": 1}')
    assert find_loader_state(tmp_path, 1) == {"version": 1, "rank": 1}
    assert find_loader_state(tmp_path, 3) == {"version": 1}
    (tmp_path / "rayshard_state_2.json").write_text("[1]")
    with pytest.raises(ConfigError, match="rayshard_state_2.json is not a rayshard loader state"):
        find_loader_state(tmp_path, 2)


def test_a_resume_with_the_interrupted_dataset_reads_the_whole_rest(ray_session, tmp_path):
    """`train()` interrupted, then resumed with the same dataset (its iterator stopped
    mid-epoch, as in a notebook): the Trainer measures its epochs by a whole epoch's
    `len()`, not the rest's, so it trains every step left, with or without the loader's
    state in the checkpoint. A checkpoint without one cannot take the loader back to an
    epoch it finished: a ConfigError, not a stale iterator."""
    data = write_tokens(str(tmp_path / "tokens"), ROWS, files=6)
    loader = Loader(ParquetSource(data), batch_size=BATCH, name=unique_name("hfsame"))
    try:
        for with_state in (False, True):  # without first: data epochs = Trainer epochs
            out = tmp_path / f"run-{with_state}"
            batches = IterableAdapter(loader.iterator(world_rank=0, world_size=1), causal_lm_inputs)
            first = _train(loader, str(out / "first"), stop=STOP, batches=batches)
            checkpoint = str(out / "first" / f"checkpoint-{STOP}")
            if not with_state:
                os.remove(state_path(checkpoint, 0))
                bare = checkpoint
            warned = pytest.warns(UserWarning, match="no rayshard loader state")
            with contextlib.nullcontext() if with_state else warned:
                second = _train(loader, str(out / "second"), resume=checkpoint, batches=batches)
            assert second.state.global_step == EPOCHS * 6
            got = _epochs(first.seen, second.seen)
            for epoch in range(EPOCHS):
                assert collections.Counter(got[epoch]) == collections.Counter(range(ROWS))
        with pytest.raises(ConfigError, match="this loader is past it \\(at data epoch 6\\)"):
            _train(loader, str(tmp_path / "back"), resume=bare, batches=batches)
    finally:
        loader.shutdown()


def test_a_second_interruption_of_a_resumed_epoch_resumes_the_whole_budget(ray_session, tmp_path):
    """The same dataset interrupted twice in one epoch (in a notebook): after the first
    resume the loader's plan of that epoch is its rest, so sending the iterator back to the
    epoch's start measured only that rest and the second resume ran out of steps a data
    epoch early. Every resume with a state first puts the loader at the start of the
    checkpoint's epoch: the budget is whole, every epoch is trained exactly once."""
    data = write_tokens(str(tmp_path / "tokens"), ROWS, files=6)
    loader = Loader(ParquetSource(data), batch_size=BATCH, name=unique_name("hftwice"))
    try:
        batches = IterableAdapter(loader.iterator(world_rank=0, world_size=1), causal_lm_inputs)
        out, runs, resume = tmp_path / "out", [], None
        for stop in (7, 10, None):  # epoch 1 after 1 of its batches, after 4, to the end
            runs.append(_train(loader, str(out / str(stop)), resume, stop, batches, 1))
            resume = str(out / str(stop) / f"checkpoint-{stop}")
    finally:
        loader.shutdown()
    assert runs[-1].state.global_step == EPOCHS * 6
    got = _epochs(*(run.seen for run in runs))
    for epoch in range(EPOCHS):
        assert collections.Counter(got[epoch]) == collections.Counter(range(ROWS)), epoch


class EvalRecorder(Trainer):
    """Records the dataset rows of every evaluation step; raises after `stop` of them."""

    evaluated: list[int]
    stop: int | None = None

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        self.evaluated += row_ids(inputs)
        if self.stop is not None and len(self.evaluated) >= self.stop:
            raise _Stop
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)


def test_an_evaluation_after_an_interrupted_one_reads_the_whole_set(ray_session, tmp_path):
    """An evaluation reads one whole epoch of the evaluation loader, also after one that
    was interrupted mid-way (its iterator stopped mid-epoch): not the rest of that epoch.
    A resumed job's evaluation loader is a new one, which starts an epoch anyway: its state
    is not in the Trainer's checkpoints."""
    data = write_tokens(str(tmp_path / "tokens"), ROWS, files=6)
    loader = Loader(ParquetSource(data), batch_size=BATCH, name=unique_name("hfeval"))
    try:
        model = GPT2LMHeadModel(
            GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=SEQ)
        )
        args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[])
        evaluation = IterableAdapter(loader.iterator(world_rank=0, world_size=1), causal_lm_inputs)
        trainer = prepare_trainer(EvalRecorder(model=model, args=args, eval_dataset=evaluation))
        trainer.evaluated, trainer.stop = [], BATCH  # interrupted after its first batch
        with pytest.raises(_Stop):
            trainer.evaluate()
        trainer.evaluated, trainer.stop = [], None
        trainer.evaluate()
        assert collections.Counter(trainer.evaluated) == collections.Counter(range(ROWS))
    finally:
        loader.shutdown()
