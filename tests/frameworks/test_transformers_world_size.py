"""Hugging Face `Trainer.train(resume_from_checkpoint=...)` over rayshard on another world
size: a checkpoint written by 2 processes resumed by 1, and one written by 1 resumed by 2.
The processes are two Trainers in two threads of this process, each reading its own rank
of one loader (`Loader.iterator(world_rank=r, world_size=2)`) and writing its own
`rayshard_state_{r}.json` (their `args.process_index`); no Ray Train, so it is quick."""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import shutil
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from transformers import Trainer, TrainingArguments

from rayshard.frameworks import hf_resume
from rayshard.frameworks.hf_resume import state_path
from rayshard.frameworks.torch import IterableAdapter
from rayshard.frameworks.transformers import causal_lm_inputs
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.frameworks.hf_loops import row_ids, write_tokens
from tests.frameworks.test_transformers_resume import _Stop, cpu_args, tiny_trainer
from tests.runtime.helpers import unique_name

pytestmark = pytest.mark.ray

ROWS, BATCH, EPOCHS = 32, 8, 3  # 4 batches per epoch: 2 steps per rank on 2 ranks


class RankArgs(TrainingArguments):
    """`TrainingArguments` of one emulated process: `process_index` is `rank`."""

    rank = 0

    @property
    def process_index(self) -> int:
        return self.rank


class Recorder(Trainer):
    """Records (data epoch, dataset rows) of every training step."""

    seen: list[tuple[int, list[int]]]

    def training_step(self, model, inputs, num_items_in_batch=None):
        epoch = self.train_dataset.iterator.stats()["epoch"]
        self.seen.append((epoch, row_ids(inputs)))
        return super().training_step(model, inputs, num_items_in_batch)

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """Then wait for the other emulated processes, as real ones wait for each other
        where `accelerator.prepare` wraps the model in DDP (a collective), between the
        Trainer's `len()` of the epoch and its first `set_epoch()`: that restores the
        checkpoint's state, a new generation, and a process still before its `len()`
        would ask it as a client of the older one (a `StaleClientError`, seen once in
        five runs of `pytest -n 2 tests/frameworks` here)."""
        super().create_optimizer_and_scheduler(num_training_steps)
        self.accelerator.wait_for_everyone()

    # transformers loads the RNG file inside torch's `safe_globals()`, which adds its
    # allowed globals on entry and removes them on exit, for the whole process: one
    # thread's exit took them away under the other's `torch.load` (an UnpicklingError
    # once on this machine). Real processes share nothing; the emulated ones take turns.
    _rng_load = threading.Lock()

    def _load_rng_state(self, checkpoint):
        with self._rng_load:
            return super()._load_rng_state(checkpoint)


def _trainer(
    cls: type,
    iterator,
    rank: int,
    out: str,
    save_steps: int | None,
    stop: int | None,
    barrier: threading.Barrier | None = None,
):
    """A prepared `cls` Trainer of process `rank` over `iterator`, saving every
    `save_steps` steps (never if None) and stopped after the save of step `stop`; its
    `accelerator.wait_for_everyone()` waits at `barrier` (the emulated processes' threads)."""
    args = cpu_args(RankArgs, out, save_steps, EPOCHS)
    args.rank = rank
    trainer = tiny_trainer(cls, args, IterableAdapter(iterator, causal_lm_inputs), stop)
    if barrier is not None:
        trainer.accelerator.wait_for_everyone = functools.partial(barrier.wait, timeout=120)
    return trainer


def _train(iterator, rank: int, output_dir: str, resume, stop, barrier: threading.Barrier):
    trainer = _trainer(Recorder, iterator, rank, output_dir, stop, stop, barrier)
    with contextlib.suppress(_Stop):
        trainer.train(resume_from_checkpoint=resume)
    return trainer


def _run(data: str, name: str, world: int, out: str, resume=None, stop=None) -> list:
    """One job: a new loader (a new namespace) read by `world` Trainers at once."""
    loader = Loader(
        ParquetSource(data),
        batch_size=BATCH,
        name=name,
        shuffle=True,
        namespace=unique_name("hfws-job"),
    )
    try:
        iterators = [loader.iterator(world_rank=r, world_size=world) for r in range(world)]
        barrier = threading.Barrier(world)
        with ThreadPoolExecutor(world) as pool:
            runs = [
                pool.submit(_train, it, r, f"{out}/rank{r}", resume, stop, barrier)
                for r, it in enumerate(iterators)
            ]
            trainers = [run.result() for run in runs]
    finally:
        loader.shutdown()
    return trainers


def _checkpoint(out: str, world: int, step: int) -> str:
    """Process 0's checkpoint folder of `step`, with every other process's state file in it
    (one shared output folder, as the processes of one job write it)."""
    folder = f"{out}/rank0/checkpoint-{step}"
    for rank in range(1, world):
        shutil.copy(state_path(f"{out}/rank{rank}/checkpoint-{step}", rank), folder)
    return folder


# (processes before, processes after, the step the first run stopped after saving):
# 2 -> 1 stops in data epoch 1 (1 of its 2 steps per rank had), 1 -> 2 in epoch 0 (2 of 4).
@pytest.mark.parametrize("before, after, stop", [(2, 1, 3), (1, 2, 2)])
def test_resume_on_another_world_size_is_exactly_once(
    ray_session, tmp_path, monkeypatch, before, after, stop
):
    """Every data epoch the two runs read, the interrupted one included, is read exactly
    once across them: the state is loader-wide, and the resumed loader re-plans the rest of
    the epoch for the new world size. The Trainer's step budget is counted in its steps
    (`num_train_epochs` times the new world size's steps per epoch, less `global_step`),
    so the runs read more data epochs than asked on fewer processes (2 -> 1: into a 4th)
    and fewer on more (1 -> 2: two); the README says so."""
    data = write_tokens(str(tmp_path / "tokens"), ROWS, files=6)
    name = unique_name("hfws")
    first = _run(data, name, before, str(tmp_path / "first"), stop=stop)
    resume = _checkpoint(str(tmp_path / "first"), before, stop)
    # The warning is taken where it is issued: the two Trainers' threads each enter
    # `warnings.catch_warnings()` while loading the checkpoint, which is not thread-safe and
    # can leave one thread's filters in place for the process, so `pytest.warns` may miss
    # it (it did once in CI).
    issued: list[str] = []
    record = types.SimpleNamespace(warn=lambda message, *_, **__: issued.append(str(message)))
    monkeypatch.setattr(hf_resume, "warnings", record)
    second = _run(data, name, after, str(tmp_path / "second"), resume=resume)
    assert any("the data follows the loader's epoch" in m for m in issued), issued
    got: dict[int, list[int]] = collections.defaultdict(list)
    for trainer in [*first, *second]:
        for epoch, ids in trainer.seen:
            got[epoch] += ids
    # 2 -> 1: the budget is 3 epochs of 4 steps. 1 -> 2: the Trainer's epochs 1 and 2 (of 2
    # steps each) read the rest of data epoch 0 (1 step per rank) and data epoch 1.
    assert [t.state.global_step for t in second] == {1: [12], 2: [5, 5]}[after]
    read = {1: [0, 1, 2, 3], 2: [0, 1]}[after]  # data epochs read (the last maybe in part)
    assert sorted(got) == read
    for epoch in read:
        counts = collections.Counter(got[epoch])
        assert max(counts.values()) == 1, (epoch, counts)  # no sample twice
        if epoch < read[-1] or after == 2:
            assert sorted(counts) == list(range(ROWS)), (epoch, sorted(counts))


class SlowSaver(Recorder):
    """Process 0 of a checkpoint taken while the other process may go on: its save waits
    (as a real model's save takes a while) until process 1 acknowledged its next batch, or
    is held at the barrier that should keep it from reading one."""

    hold: Any = None  # () -> bool: whether process 1 went on or is held

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        while self.hold is not None and not self.hold():
            time.sleep(0.02)  # a wait for an event of another thread, not a timing
        super()._save_optimizer_and_scheduler(output_dir)


def test_every_process_saves_the_state_of_the_checkpoints_step(ray_session, tmp_path):
    """Process 1 saves its part of checkpoint-1 quickly and would read its step-2 batch
    while process 0 still saves the model: process 0's loader state must not count that
    batch consumed (a resume would never train on it). The prepared Trainer holds every
    process at `accelerator.wait_for_everyone()` once it took its state (here a barrier of
    the two threads, as accelerate's is of the processes)."""
    data = write_tokens(str(tmp_path / "tokens"), ROWS, files=6)
    loader = Loader(ParquetSource(data), batch_size=BATCH, name=unique_name("hfbar"))
    barrier, held = threading.Barrier(2), threading.Event()

    def wait_for_everyone(rank: int) -> None:
        if rank == 1:
            held.set()
        barrier.wait(timeout=120)

    def went_on() -> bool:
        usage = loader.stats()["consumers"].get(1, {})
        return held.is_set() or usage.get("batches", 0) >= 2

    def train(rank: int, iterator) -> None:
        trainer = _trainer(SlowSaver, iterator, rank, f"{tmp_path}/rank{rank}", 1, 2)
        trainer.accelerator.wait_for_everyone = functools.partial(wait_for_everyone, rank)
        trainer.hold = went_on if rank == 0 else None
        with contextlib.suppress(_Stop):
            trainer.train()

    try:
        iterators = [loader.iterator(world_rank=r, world_size=2) for r in range(2)]
        with ThreadPoolExecutor(2) as pool:
            for run in [pool.submit(train, r, it) for r, it in enumerate(iterators)]:
                run.result()
    finally:
        loader.shutdown()
    states = [
        json.loads(Path(state_path(f"{tmp_path}/rank{r}/checkpoint-1", r)).read_text())
        for r in range(2)
    ]
    assert states[0] == states[1]
    assert sum(hi - lo for lo, hi in states[0]["consumed"]) == 2 * BATCH  # step 1's batches
