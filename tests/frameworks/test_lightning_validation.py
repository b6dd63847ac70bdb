"""Lightning's validation over a rayshard iterator, in one process: a validation cut
short (the sanity check's two batches, `limit_val_batches`) does not leave the next
validation the rest of its epoch (fewer batches each time, then Lightning's refusal of a
fraction of one batch); each validation reads its epoch from the start, and a whole one
moves on to the next epoch."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from rayshard.errors import ConfigError
from rayshard.frameworks.hf_resume import ResumingDataLoader
from rayshard.frameworks.lightning import LightningBatches, RayshardCheckpoint
from rayshard.frameworks.torch import IterableAdapter
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.frameworks.pl_trainers import quiet_trainer
from tests.runtime.helpers import unique_name, write_parquet

pytestmark = pytest.mark.ray

TRAIN_ROWS, VAL_ROWS, BATCH, EPOCHS = 48, 64, 8, 3  # 8 validation batches


class Validated(pl.LightningModule):
    """Records the ids of every validation run (the sanity check's apart)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.runs: list[list[int]] = []
        self.sanity: list[int] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return (self.lin(batch["x"]) ** 2).mean()

    def on_validation_epoch_start(self) -> None:
        if not self.trainer.sanity_checking:
            self.runs.append([])

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        ids = batch["id"][~batch["_padded"]].tolist()
        (self.sanity if self.trainer.sanity_checking else self.runs[-1]).extend(ids)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader(folder, rows: int, name: str) -> Loader:
    """A loader of `rows` ids in one Parquet file written in `folder`."""
    return Loader(
        ParquetSource(write_parquet(folder, [rows])), batch_size=BATCH, name=unique_name(name)
    )


@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("limit", [None, 0.5])
def test_every_validation_reads_its_epoch_from_the_start(ray_session, tmp_path, limit, wrapped):
    train = _loader(tmp_path / "train", TRAIN_ROWS, "plv")
    val = _loader(tmp_path / "val", VAL_ROWS, "plv-val")
    try:
        batches = LightningBatches(train.iterator(world_rank=0, world_size=1))
        val_batches = val.iterator(world_rank=0, world_size=1)
        if wrapped:  # (as a LightningBatches too: its len() counts the epoch's batches had)
            val_batches = LightningBatches(val_batches)
        model = Validated()
        quiet_trainer(
            RayshardCheckpoint(batches, val_batches),
            epochs=EPOCHS,
            num_sanity_val_steps=2,
            limit_val_batches=limit,
        ).fit(model, train_dataloaders=batches, val_dataloaders=val_batches)
        assert model.sanity == list(range(2 * BATCH))  # two batches, then read again
        assert len(model.runs) == EPOCHS
        if limit is None:  # whole validations: every row, epoch after epoch
            assert all(sorted(run) == list(range(VAL_ROWS)) for run in model.runs)
            assert val_batches.epoch == EPOCHS
        else:  # the same half of the same (unshuffled) epoch each time
            assert model.runs == [list(range(VAL_ROWS // 2))] * EPOCHS
    finally:
        train.shutdown()
        val.shutdown()


def test_a_loop_that_stops_at_len_refuses_an_estimated_length(ray_session, tmp_path):
    # dynamic without equal steps: a rank's len() is an estimate, and Lightning and the
    # Hugging Face Trainer end an epoch there (early, or the next epoch would come out empty)
    data = write_parquet(tmp_path / "train", [TRAIN_ROWS])
    loader = Loader(
        ParquetSource(data),
        batch_size=BATCH,
        name=unique_name("plv-dyn"),
        policy="dynamic",
        equal_steps=False,
    )
    try:
        batches = LightningBatches(loader.iterator(world_rank=0, world_size=1))
        trainer = quiet_trainer(epochs=1)
        with pytest.raises(ConfigError, match="equal_steps=True"):
            trainer.fit(Validated(), train_dataloaders=batches)
        adapter = IterableAdapter(loader.iterator(world_rank=0, world_size=1))
        with pytest.raises(ConfigError, match="Hugging Face Trainer"):
            iter(ResumingDataLoader(adapter))
    finally:
        loader.shutdown()

    exact = Loader(
        ParquetSource(data), batch_size=BATCH, name=unique_name("plv-eq"), policy="dynamic"
    )
    try:  # with equal steps (the default) the same loops read
        adapter = IterableAdapter(exact.iterator(world_rank=0, world_size=1))
        assert len(list(ResumingDataLoader(adapter))) == TRAIN_ROWS // BATCH
    finally:
        exact.shutdown()


class Trained(Validated):
    """Records the ids of every training batch, by Lightning epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[int]] = []

    def on_train_epoch_start(self) -> None:
        self.seen.append([])

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.seen[-1].extend(batch["id"][~batch["_padded"]].tolist())
        return super().training_step(batch, batch_idx)


def test_limit_train_batches_goes_on_through_the_data_epoch(ray_session, tmp_path):
    """`limit_train_batches` ends a Lightning epoch mid-way through the data epoch: the
    next Lightning epoch goes on with its rest (a torch `DataLoader` would start again),
    and the data epoch ends once it was read whole."""
    train = _loader(tmp_path / "train", TRAIN_ROWS, "plt")
    try:
        batches = LightningBatches(train.iterator(world_rank=0, world_size=1))
        model = Trained()
        trainer = quiet_trainer(RayshardCheckpoint(batches), epochs=3, limit_train_batches=2)
        trainer.fit(model, train_dataloaders=batches)
        third = TRAIN_ROWS // 3  # 2 batches of the data epoch's 6 per Lightning epoch
        assert model.seen == [list(range(k * third, (k + 1) * third)) for k in range(3)]
        assert batches.epoch == 1
    finally:
        train.shutdown()
