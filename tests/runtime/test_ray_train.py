"""A real two-worker TorchTrainer (CPU, gloo) over rayshard: two epochs, exact coverage,
loader state in Ray Train checkpoints."""

from __future__ import annotations

import json
import os

import pytest
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import rayshard.train
from rayshard.audit import start_audit
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import unique_name, write_parquet
from tests.runtime.train_loops import ddp_loop

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_torch_trainer_two_workers_two_epochs_exact(ray_session, tmp_path):
    data = write_parquet(tmp_path / "data", [50, 40, 31], row_group_size=16)
    loader = Loader(ParquetSource(data), batch_size=8, name=unique_name("train"), shuffle=True)
    audit = start_audit(121)
    trainer = TorchTrainer(
        ddp_loop,
        train_loop_config={"loader": loader, "audit": audit, "epochs": 2},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=unique_name("run"), storage_path=str(tmp_path / "results")),
    )
    result = trainer.fit()
    assert result.error is None
    report = ray.get(audit.report.remote())
    assert sorted(report) == [0, 1]
    for epoch, row in report.items():
        assert row["lost"] == 0 and row["duplicates"] == 0, (epoch, row)
    assert result.metrics["state_epoch"] == 2  # the state after epoch 1 points at epoch 2
    with (
        result.checkpoint.as_directory() as folder,
        open(os.path.join(folder, rayshard.train.STATE_FILE)) as handle,
    ):
        state = json.load(handle)
    assert state["epoch"] == 2 and state["consumed"] == []
    loader.shutdown()
