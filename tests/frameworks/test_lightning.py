"""PyTorch Lightning over rayshard: real Lightning, real TorchTrainer on the
session's local Ray, 2 workers, in one run of the example's worker loop. Every epoch covers
the dataset exactly once; the loader's state rides in Lightning's checkpoint, and resuming
from it (Lightning's `ckpt_path`, after Ray Train restarts a group whose worker process died
mid-epoch) skips and repeats nothing relative to the checkpoint resumed from; the
validation loader is restored too, and the validation metric ignores padding rows."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import ray
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from examples.train_lightning import Classifier, make_dataset, make_loaders
from rayshard.frameworks.lightning import CHECKPOINT_KEY, VAL_CHECKPOINT_KEY
from rayshard.runtime.audit import start_audit
from tests.frameworks.lightning_loops import CKPT_FILE, ledger_loop
from tests.multinode.scenarios import TrainLedger
from tests.runtime.helpers import unique_name

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROWS, VAL_ROWS, BATCH, EPOCHS = 224, 101, 16, 3  # 7 steps per epoch on 2 ranks; validation pads


def _trainer(loop, config: dict, tmp_path, **run) -> TorchTrainer:
    return TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=unique_name("pl"), storage_path=str(tmp_path / "results"), **run),
    )


def _val_loss(model: Classifier, folder: str) -> tuple[float, int]:
    table = pq.read_table(folder)
    x = torch.from_numpy(np.stack(table["x"].to_numpy(zero_copy_only=False)).astype(np.float32))
    label = torch.from_numpy(table["label"].to_numpy())
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model.net(x), label, reduction="sum")
    return float(loss) / len(label), len(label)


def test_fit_killed_mid_epoch_resumes_exactly_with_padding_free_validation(ray_session, tmp_path):
    # The example's `train_loop_per_worker` (its `fit`: RayTrainReportCallback reports a
    # checkpoint at every epoch end, global steps 7, 14, 21) with a LedgerCallback that
    # reports one mid-epoch every 3 global steps (3, 6 | 9, 12 | 15, 18). Rank 1 of the first
    # attempt exits its process at its 13th step (epoch 1; rank 0 reported 2 checkpoints
    # long before). A report returns only once Ray Train took the rank's previous one
    # (`ray.train.report` blocks while the result queue, of size 1, is full) and every rank
    # reported it (a barrier follows each report), so when rank 1 dies after reporting step
    # 12, step 9's checkpoint is registered: the group resumes mid-epoch 1, from 9 or 12.
    # The validation loader runs every epoch: restored from the checkpoint with the rest,
    # the new validation iterators go on with the next validation epoch (not stale).
    data = make_dataset(str(tmp_path / "train"), ROWS)
    val = make_dataset(str(tmp_path / "val"), VAL_ROWS, seed=1)
    loader, val_loader = make_loaders(data, val, BATCH, name=unique_name("pl"))
    audit = start_audit(ROWS)
    ledger = ray.remote(TrainLedger).options(num_cpus=0).remote()
    config = {"loader": loader, "val_loader": val_loader, "audit": audit, "ledger": ledger}
    config.update({"epochs": EPOCHS, "every": 3, "crash_at": 13})
    result = _trainer(
        ledger_loop, config, tmp_path, failure_config=FailureConfig(max_failures=1)
    ).fit()
    assert result.error is None, result.error
    ledger_audit = ray.get(ledger.audit.remote(ROWS, EPOCHS))
    assert ledger_audit["world_sizes"] == [2, 2], ledger_audit
    resumed = ledger_audit["resumed_from"][1]
    assert resumed is not None and resumed["attempt"] == 0, resumed
    assert resumed["seq"] in (9, 12) and resumed["epoch"] == 1, resumed  # mid-epoch 1
    events = [e["event"] for e in loader.stats()["events"]]
    assert "rank_lost" in events, events  # the coordinator noticed the dead worker's rank
    # Every epoch exactly once relative to the checkpoint resumed from (the ledger drops
    # what attempt 0 trained after it) ...
    for epoch, row in ledger_audit["per_epoch"].items():
        assert row["lost"] == 0 and row["duplicates"] == 0 and row["seen"] == ROWS, (epoch, row)
    # ... and, by the model's own audit (the example's), absolutely in the epochs before
    # and after the one the kill cut: epoch 1 was trained once more from the checkpoint on.
    report = ray.get(audit.report.remote())
    assert sorted(report) == list(range(EPOCHS)), report
    for epoch in (0, 2):
        row = report[epoch]
        assert row["lost"] == 0 and row["duplicates"] == 0 and row["seen"] == ROWS, (epoch, row)
    # The loader's state rides in Lightning's checkpoint (RayshardCheckpoint); the last one
    # is the example's, after the last epoch.
    with result.checkpoint.as_directory() as folder:
        ckpt = torch.load(os.path.join(folder, CKPT_FILE), weights_only=False)
    state = ckpt[CHECKPOINT_KEY]["loader"]
    assert state["epoch"] == EPOCHS and state["consumed"] == []
    val_state = ckpt[VAL_CHECKPOINT_KEY]  # the validation loader's, restored with the rest
    assert val_state["epoch"] == EPOCHS and val_state["consumed"] == [], val_state
    # Validation counted the real rows once each (101 over 2 ranks: padding on one) and
    # its loss equals the loss of the final weights over the whole validation set.
    model = Classifier()
    model.load_state_dict(ckpt["state_dict"])
    expected, rows = _val_loss(model, val)
    assert result.metrics["val_rows"] == rows == VAL_ROWS
    assert result.metrics["val_loss"] == pytest.approx(expected, rel=1e-5)
    loader.shutdown()
    val_loader.shutdown()
