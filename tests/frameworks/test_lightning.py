"""PyTorch Lightning over rayshard: real Lightning, real TorchTrainer on the
session's local Ray, 2 workers. Every epoch covers the dataset exactly once; the loader's
state rides in Lightning's checkpoint, and resuming from it (Lightning's `ckpt_path`, after
Ray Train restarts a group whose worker process died mid-epoch) skips and repeats nothing
relative to the checkpoint resumed from; the validation metric ignores padding rows."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import ray
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from examples.train_lightning import Classifier, make_dataset, make_loaders, train_loop_per_worker
from rayshard.frameworks.lightning import CHECKPOINT_KEY
from rayshard.runtime.audit import start_audit
from tests.frameworks.lightning_loops import CKPT_FILE, ledger_loop
from tests.multinode.scenarios import TrainLedger
from tests.runtime.helpers import unique_name

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROWS, VAL_ROWS, BATCH = 224, 101, 16  # 7 steps per epoch on 2 ranks; validation pads


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


def test_fit_three_epochs_exact_coverage_and_padding_free_validation(ray_session, tmp_path):
    data = make_dataset(str(tmp_path / "train"), ROWS)
    val = make_dataset(str(tmp_path / "val"), VAL_ROWS, seed=1)
    loader, val_loader = make_loaders(data, val, BATCH, name=unique_name("pl"))
    audit = start_audit(ROWS)
    config = {"loader": loader, "val_loader": val_loader, "audit": audit, "epochs": 3}
    result = _trainer(train_loop_per_worker, config, tmp_path).fit()
    assert result.error is None, result.error
    report = ray.get(audit.report.remote())
    assert sorted(report) == [0, 1, 2], report
    for epoch, row in report.items():
        assert row["lost"] == 0 and row["duplicates"] == 0 and row["seen"] == ROWS, (epoch, row)
    # The loader's state rides in Lightning's checkpoint (RayshardCheckpoint).
    with result.checkpoint.as_directory() as folder:
        ckpt = torch.load(os.path.join(folder, CKPT_FILE), weights_only=False)
    state = ckpt[CHECKPOINT_KEY]["loader"]
    assert state["epoch"] == 3 and state["consumed"] == []
    # Validation counted the real rows once each (101 over 2 ranks: padding on one) and
    # its loss equals the loss of the final weights over the whole validation set.
    model = Classifier()
    model.load_state_dict(ckpt["state_dict"])
    expected, rows = _val_loss(model, val)
    assert result.metrics["val_rows"] == rows == VAL_ROWS
    assert result.metrics["val_loss"] == pytest.approx(expected, rel=1e-5)
    loader.shutdown()
    val_loader.shutdown()


def test_worker_killed_mid_epoch_resumes_from_lightning_checkpoint_exactly(ray_session, tmp_path):
    # 160 rows: 5 steps per epoch; checkpoints only mid-epoch, after steps 3, 6 and 9 (the
    # epoch-end path is tested in test_lightning_resume.py); rank 1 dies at its 7th step or
    # later (epoch 1), once rank 0 reported two checkpoints. Whichever of them Ray Train had
    # registered, the group resumes mid-epoch.
    # A validation loader runs every epoch too: restored from the checkpoint with the rest,
    # the new validation iterators go on with the next validation epoch (not stale).
    rows = 160
    data = make_dataset(str(tmp_path / "train"), rows)
    val = make_dataset(str(tmp_path / "val"), 40, seed=1)
    loader, val_loader = make_loaders(data, val, BATCH, name=unique_name("plr"))
    ledger = ray.remote(TrainLedger).options(num_cpus=0).remote()
    config = {"loader": loader, "val_loader": val_loader, "ledger": ledger, "epochs": 2}
    config.update({"every": 3, "crash_at": 7, "epoch_end": False})
    result = _trainer(
        ledger_loop, config, tmp_path, failure_config=FailureConfig(max_failures=1)
    ).fit()
    assert result.error is None, result.error
    audit = ray.get(ledger.audit.remote(rows, 2))
    assert audit["world_sizes"] == [2, 2], audit
    resumed = audit["resumed_from"][1]
    assert resumed is not None and resumed["attempt"] == 0, resumed
    assert resumed["seq"] in (3, 6), resumed  # mid-epoch
    for epoch, row in audit["per_epoch"].items():
        assert row["lost"] == 0 and row["duplicates"] == 0 and row["seen"] == rows, (epoch, row)
    loader.shutdown()
    val_loader.shutdown()
