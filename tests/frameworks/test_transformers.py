"""Hugging Face `transformers.Trainer` over rayshard inside Ray Train (real transformers,
real TorchTrainer, 2 workers): a tiny GPT-2 built from a config, token rows from Parquet.
`num_train_epochs` gives every epoch exactly once; `max_steps` stops at that step count,
mid-epoch, with no row repeated (one Trainer shows both: a second `train()`)."""

from __future__ import annotations

import pytest
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from rayshard.loader import Loader
from rayshard.runtime.audit import start_audit
from rayshard.sources.parquet import ParquetSource
from tests.frameworks.hf_loops import hf_loop, write_tokens
from tests.runtime.helpers import unique_name

ROWS, BATCH = 200, 16  # 2 ranks: 7 steps per epoch, the last batch of one rank padded


def test_causal_lm_inputs_label_padding_rows_and_drop_rayshard_keys():
    import torch

    from rayshard.frameworks.transformers import IGNORE_INDEX, causal_lm_inputs

    batch = {
        "input_ids": torch.arange(12).reshape(3, 4),
        "_index": torch.tensor([5, 6, 6]),
        "_padded": torch.tensor([False, False, True]),
    }
    inputs = causal_lm_inputs(batch)
    assert set(inputs) == {"input_ids", "attention_mask", "labels"}
    assert (inputs["labels"][:2] == batch["input_ids"][:2]).all()
    assert (inputs["labels"][2] == IGNORE_INDEX).all()
    assert (batch["input_ids"][2] == torch.arange(8, 12)).all(), "the batch was modified"
    assert (inputs["attention_mask"] == 1).all()


@pytest.mark.parametrize("mask_key", ["input_ids_mask", "mask"])  # a Padding rule's; packing's
def test_causal_lm_inputs_ignore_the_padded_tail_of_rows(mask_key):
    import torch

    from rayshard.frameworks.transformers import IGNORE_INDEX, causal_lm_inputs

    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0]]),
        mask_key: mask,
        "_padded": torch.tensor([False, False]),
    }
    inputs = causal_lm_inputs(batch)
    assert inputs["labels"].tolist() == [[5, 6, 7, IGNORE_INDEX], [8] + [IGNORE_INDEX] * 3]
    assert inputs["attention_mask"].tolist() == mask.long().tolist()
    assert inputs["attention_mask"].dtype == batch["input_ids"].dtype


def test_prepared_trainer_passes_rayshard_batches_through_for_evaluation_too(tmp_path):
    """An `IterableAdapter` evaluation set (alone, or in a dict) is read one rayshard batch
    per step, not re-batched to `per_device_eval_batch_size`; other sets are the Trainer's."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from rayshard.frameworks.torch import IterableAdapter
    from rayshard.frameworks.transformers import prepare_trainer

    batches = [{"input_ids": torch.full((8, 4), i)} for i in range(3)]  # 3 batches of 8 rows
    adapter = IterableAdapter(batches)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=16))
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to=[], use_cpu=True
    )
    trainer = prepare_trainer(Trainer(model=model, args=args, eval_dataset=adapter))
    seen = [b["input_ids"].shape for b in trainer.get_eval_dataloader()]
    assert seen == [torch.Size([8, 4])] * 3
    by_name = prepare_trainer(Trainer(model=model, args=args, eval_dataset={"val": adapter}))
    assert len(list(by_name.get_eval_dataloader("val"))) == 3
    plain = prepare_trainer(Trainer(model=model, args=args, eval_dataset=[{"input_ids": [1]}] * 8))
    assert [len(b["input_ids"]) for b in plain.get_eval_dataloader()] == [4, 4]  # its own


@pytest.mark.ray
@pytest.mark.slow
def test_trainer_num_train_epochs_and_max_steps_exact(ray_session, tmp_path):
    """One Trainer per worker: `num_train_epochs=2`, then `train()` again from the last
    checkpoint with `max_steps=17` (it wins over the 2 epochs: 3 steps into epoch 2)."""
    data = write_tokens(str(tmp_path / "tokens"), ROWS)
    loader = Loader(ParquetSource(data), batch_size=BATCH, name=unique_name("hf"), shuffle=True)
    audit = start_audit(ROWS)
    run = {"loader": loader, "audit": audit, "epochs": 2, "then_max_steps": 17}
    result = TorchTrainer(
        hf_loop,
        train_loop_config={"runs": [run]},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=unique_name("hf"), storage_path=str(tmp_path / "results")),
    ).fit()
    assert result.error is None, result.error
    steps = 7  # per epoch and rank: ceil(200 / 2 / 16)
    # `batches`: training steps, summed over the 2 ranks; the second train()'s epochs + 10.
    report = ray.get(audit.report.remote())
    assert sorted(report) == [0, 1, 12], report  # the first train() stopped after 2 epochs
    for epoch in (0, 1):
        row = report[epoch]
        assert row["lost"] == 0 and row["duplicates"] == 0, (epoch, row)
        assert row["batches"] == 2 * steps, (epoch, row)
    assert report[12]["batches"] == 2 * (17 - 2 * steps), report
    assert report[12]["duplicates"] == 0 and 0 < report[12]["seen"] <= 2 * BATCH * 3, report
    loader.shutdown()
