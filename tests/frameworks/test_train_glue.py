"""`rayshard.train` in a real `TorchTrainer` (2 workers, the session's local Ray): a loop
that takes an iterator per epoch and reports checkpoints mid-epoch reads epoch after epoch
(each new iterator resumed from the run's latest checkpoint, which Ray Train updates at
every report, rewound the loader to it: epochs 1 and 2 re-read epoch 0's tail), and a
validation loader taken after a report, with its state saved beside the training one's,
reads its own epochs (it found the training loader's state and failed)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.frameworks.train_glue_loops import iterator_per_epoch_loop
from tests.runtime.helpers import unique_name, write_parquet

pytestmark = [pytest.mark.ray, pytest.mark.slow]

EPOCHS = 3


@pytest.mark.timeout(600)
def test_an_iterator_per_epoch_with_mid_epoch_checkpoints_reads_epoch_after_epoch(
    ray_session, tmp_path
):
    train = Loader(
        ParquetSource(write_parquet(tmp_path / "train", [30, 34])),
        batch_size=4,
        shuffle=True,
        seed=5,
        name=unique_name("glue"),
    )
    val = Loader(
        ParquetSource(write_parquet(tmp_path / "val", [18])), batch_size=4, name=unique_name("val")
    )
    out = tmp_path / "out"
    out.mkdir()
    config = {"loader": train, "val": val, "epochs": EPOCHS, "every": 3, "out": str(out)}
    try:
        result = TorchTrainer(
            iterator_per_epoch_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name=unique_name("glue"), storage_path=str(tmp_path / "runs")),
        ).fit()
        assert result.error is None
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        for epoch in range(EPOCHS):
            assert [seen[epoch]["epoch"] for seen in ranks] == [epoch, epoch]
            assert Counter(i for seen in ranks for i in seen[epoch]["ids"]) == Counter(range(64))
            assert [seen[epoch]["val_epoch"] for seen in ranks] == [epoch, epoch]
            val_ids = Counter(i for seen in ranks for i in seen[epoch]["val_ids"])
            assert val_ids == Counter(range(18))
    finally:
        train.shutdown()
        val.shutdown()
