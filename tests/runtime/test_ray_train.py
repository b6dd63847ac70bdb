"""A real two-worker TorchTrainer (CPU, gloo) over rayshard: two epochs, exact coverage,
loader state in Ray Train checkpoints."""

from __future__ import annotations

import json
import os

import pytest
import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import rayshard.train
from rayshard.loader import Loader
from rayshard.runtime.audit import start_audit
from rayshard.sources.parquet import ParquetSource
from tests.multinode.scenarios import TrainLedger, elastic_loop
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


def test_same_size_restart_after_a_worker_dies_resumes_exactly(ray_session, tmp_path):
    # Rank 1's process exits mid-run, after mid-epoch checkpoints; Ray Train restarts the
    # group with the same 2 workers from the latest checkpoint. The new workers take
    # the same ranks again (the old readers are replaced). Relative to the checkpoint the
    # run resumed from, every epoch is covered exactly once.
    rows = 120
    data = write_parquet(tmp_path / "data", [40, 50, 30], row_group_size=8)
    loader = Loader(ParquetSource(data), batch_size=4, name=unique_name("restart"))
    ledger = ray.remote(TrainLedger).options(num_cpus=0).remote()
    trainer = TorchTrainer(
        elastic_loop,
        train_loop_config={
            "loader": loader,
            "ledger": ledger,
            "epochs": 2,
            "every": 4,
            "delay": 0.02,
            "crash_at": 10,
        },
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=unique_name("run"),
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    result = trainer.fit()
    assert result.error is None, result.error
    audit = ray.get(ledger.audit.remote(rows, 2))
    assert audit["world_sizes"] == [2, 2], audit["world_sizes"]
    resumed = audit["resumed_from"][1]
    assert resumed is not None and resumed["world_size"] == 2, f"resumed from {resumed}"
    for epoch, row in audit["per_epoch"].items():
        assert row["lost"] == 0 and row["duplicates"] == 0 and row["seen"] == rows, (epoch, row)
    events = [e["event"] for e in loader.stats()["events"]]
    assert "rank_lost" in events, events
    loader.shutdown()
