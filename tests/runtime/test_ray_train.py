"""A real two-worker TorchTrainer (CPU, gloo) over rayshard: a DDP model trained on a
shuffled, padded static split, a worker process that dies mid-run, Ray Train's restart from
the latest checkpoint, exact coverage relative to it, loader state in the checkpoints."""

from __future__ import annotations

import json
import os

import pytest
import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import rayshard.train
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.multinode.scenarios import TrainLedger, elastic_loop
from tests.runtime.helpers import unique_name, write_parquet

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_ddp_run_whose_worker_dies_restarts_and_resumes_exactly(ray_session, tmp_path):
    # 121 rows, batch 4, 2 ranks: 16 steps per rank and epoch, the last one padded on one
    # rank; every batch is a DDP step (an all-reduce: unequal steps would hang). Rank 1's
    # process exits mid-run after mid-epoch checkpoints; Ray Train restarts the group with
    # the same 2 workers from the latest checkpoint. The new workers take the same ranks
    # again (the old readers are replaced). Relative to the checkpoint the run resumed
    # from, every epoch is covered exactly once; the run ends with the finished state.
    rows = 121
    data = write_parquet(tmp_path / "data", [50, 40, 31], row_group_size=8)
    loader = Loader(ParquetSource(data), batch_size=4, name=unique_name("restart"), shuffle=True)
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
            "ddp": True,
            "final_checkpoint": True,
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
    # The last checkpoint holds the finished loader: the state after epoch 1 is epoch 2's.
    assert result.metrics["state_epoch"] == 2
    with (
        result.checkpoint.as_directory() as folder,
        open(os.path.join(folder, rayshard.train.STATE_FILE)) as handle,
    ):
        state = json.load(handle)
    assert state["epoch"] == 2 and state["consumed"] == []
    loader.shutdown()
