"""Lightning's `ckpt_path` resume over rayshard, in one process (no Ray Train, so it is
quick): stop after a checkpoint taken mid-epoch or after an epoch's last batch, start a new
Trainer and loader from that checkpoint, and every epoch is covered exactly once relative
to the checkpoint. Also pins the Lightning behaviour that makes `RayshardCheckpoint` and
`LightningBatches` necessary (see rayshard/frameworks/lightning.py)."""

from __future__ import annotations

import collections

import lightning.pytorch as pl
import pytest
import torch

from rayshard.frameworks.lightning import CHECKPOINT_KEY, LightningBatches, RayshardCheckpoint
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.frameworks.pl_trainers import quiet_trainer
from tests.runtime.helpers import unique_name, write_parquet

pytestmark = pytest.mark.ray

SIZES = [50, 40, 30]  # 120 rows, batch 8: 15 steps per epoch
ROWS, EPOCHS = sum(SIZES), 3


class Recorder(pl.LightningModule):
    """Records the real ids of every training step per Lightning epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.seen: dict[int, list[int]] = collections.defaultdict(list)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        real = ~batch["_padded"]
        self.seen[self.current_epoch] += batch["id"][real].tolist()
        return ((self.lin(batch["x"]).squeeze(1) * real) ** 2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Stop(Exception):
    pass


class SaveAndStop(pl.Callback):
    """Saves a checkpoint to `end` at the end of epoch 0 (the run goes on), and one to
    `mid` after global step `step` (mid-epoch), then stops the run by raising."""

    def __init__(self, end: str, mid: str, step: int) -> None:
        self.end, self.mid, self.step = end, mid, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.mid)
            raise _Stop

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch == 0:
            trainer.save_checkpoint(self.end)


def _trainer(*callbacks, epochs: int = EPOCHS) -> pl.Trainer:
    return quiet_trainer(*callbacks, epochs=epochs)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("pl"), SIZES, row_group_size=8)


def test_ckpt_path_resume_covers_every_epoch_exactly_once(ray_session, dataset, tmp_path):
    # One first run saves a checkpoint after epoch 0's last batch and one mid-epoch (after
    # global step 20: 5 batches into epoch 1), then stops; each is resumed by a new loader
    # and a new Trainer, relative to what the first run had trained on when it was saved.
    name = unique_name("plres")
    end, mid = str(tmp_path / "end.ckpt"), str(tmp_path / "mid.ckpt")
    loader = Loader(ParquetSource(dataset), batch_size=8, name=name, shuffle=True)
    batches = LightningBatches(loader.iterator(world_rank=0, world_size=1))
    first = Recorder()
    with pytest.raises(_Stop):
        _trainer(RayshardCheckpoint(batches), SaveAndStop(end, mid, 20)).fit(first, batches)
    loader.shutdown()
    assert sorted(first.seen) == [0, 1] and len(first.seen[0]) == ROWS, first.seen.keys()

    for path, batches_had, had in ((mid, 5, first.seen), (end, 0, {0: first.seen[0]})):
        saved = torch.load(path, weights_only=False)[CHECKPOINT_KEY]
        assert saved["batches"] == batches_had, (path, saved)
        # A new loader of the same name and configuration (as after a restart), a new Trainer.
        loader = Loader(ParquetSource(dataset), batch_size=8, name=name, shuffle=True)
        batches = LightningBatches(loader.iterator(world_rank=0, world_size=1))
        second = Recorder()
        _trainer(RayshardCheckpoint(batches)).fit(second, batches, ckpt_path=path)
        for epoch in range(EPOCHS):
            ids = collections.Counter(had.get(epoch, []) + second.seen.get(epoch, []))
            assert ids == collections.Counter(range(ROWS)), (epoch, path, sorted(ids.items())[:5])
        loader.shutdown()


def test_lightning_does_not_restore_an_iterables_state_from_an_epoch_end_checkpoint():
    """The fact `RayshardCheckpoint` exists for (lightning 2.6, FitLoop.restarting): after
    loading a checkpoint taken once an epoch finished, `restarting` is False, and
    `_load_combined_loader_states` only loads the iterables' states when restarting."""
    from lightning.pytorch.loops.fit_loop import _FitLoop

    trainer = _trainer()
    loop = _FitLoop(trainer)
    loop.epoch_progress.current.ready = loop.epoch_progress.current.started = 1
    loop.epoch_progress.current.processed = 1  # the epoch's last batch was processed
    loop.restarting = True
    assert loop.restarting is False


def test_checkpoint_callback_and_snapshot_errors_name_the_fix():
    with pytest.raises(TypeError, match=r"LightningBatches\(iterator\)"):
        RayshardCheckpoint(object())
    with pytest.raises(ValueError, match="'loader' and 'batches'"):
        LightningBatches(object()).restore({"epoch": 1})


def test_epochs_of_different_lengths_are_each_one_whole_data_epoch(ray_session, tmp_path):
    """Lightning keeps the first epoch's `len()` as a limit unless dataloaders reload
    every epoch (`RayshardCheckpoint` sets that): with two shards of 129 and 128 rows
    rotating (5 and 4 batches), every Lightning epoch is one whole shard."""
    data = write_parquet(tmp_path / "data", [257], row_group_size=16)
    loader = Loader(
        ParquetSource(data),
        batch_size=32,
        rotation="stride",
        total_shards=2,
        name=unique_name("pl-len"),
    )
    batches = LightningBatches(loader.iterator(world_rank=0, world_size=1))
    model = Recorder()
    _trainer(RayshardCheckpoint(batches), epochs=4).fit(model, train_dataloaders=batches)
    got = {epoch: sorted(seen) for epoch, seen in model.seen.items()}
    assert sorted(got) == [0, 1, 2, 3]
    assert sorted(len(got[e]) for e in (0, 1)) == [128, 129], {e: len(v) for e, v in got.items()}
    assert got[0] == got[2] and got[1] == got[3]
    assert sorted(got[0] + got[1]) == list(range(257))
    loader.shutdown()
