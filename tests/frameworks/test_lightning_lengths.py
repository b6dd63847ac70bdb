"""Lightning in one process (no Ray Train): each Lightning epoch is one whole data epoch,
also when epochs have different batch counts (shards of other sizes rotate)."""

from __future__ import annotations

import collections
import logging
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

pl = pytest.importorskip("lightning.pytorch", reason="the Lightning tests need lightning")

from rayshard.frameworks.lightning import LightningBatches, RayshardCheckpoint  # noqa: E402
from rayshard.loader import Loader  # noqa: E402
from rayshard.sources.parquet import ParquetSource  # noqa: E402
from tests.runtime.helpers import unique_name  # noqa: E402


class Recorder(pl.LightningModule):
    """Records the real sample ids of every training step, by Lightning's epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.seen: dict[int, list[int]] = collections.defaultdict(list)

    def training_step(self, batch, batch_idx):
        real = ~batch["_padded"]
        self.seen[self.current_epoch] += batch["id"][real].tolist()
        return ((self.lin(batch["x"]).squeeze(1) * real) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_epochs_of_different_lengths_are_each_one_whole_data_epoch(ray_session, tmp_path):
    ids = np.arange(257, dtype=np.int64)  # 2 shards of 129 and 128 rows: 5 and 4 batches
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 4).astype(np.float32)), 4)
    pq.write_table(pa.table({"id": ids, "x": x}), tmp_path / "a.parquet", row_group_size=16)
    loader = Loader(
        ParquetSource(tmp_path),
        batch_size=32,
        rotation="stride",
        total_shards=2,
        name=unique_name("pl-len"),
    )
    batches = LightningBatches(loader.iterator(world_rank=0, world_size=1))
    model = Recorder()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    trainer = pl.Trainer(
        max_epochs=4,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[RayshardCheckpoint(batches)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer.fit(model, train_dataloaders=batches)
    got = {epoch: sorted(seen) for epoch, seen in model.seen.items()}
    assert sorted(got) == [0, 1, 2, 3]
    # every Lightning epoch is one shard, whole (129 and 128 rows: 5 and 4 batches in turn)
    assert sorted(len(got[e]) for e in (0, 1)) == [128, 129], {e: len(v) for e, v in got.items()}
    assert got[0] == got[2] and got[1] == got[3]
    assert sorted(got[0] + got[1]) == list(range(257))
    loader.shutdown()
