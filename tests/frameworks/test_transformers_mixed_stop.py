"""Hugging Face `Trainer` over rayshard on 2 processes (two Trainers in threads, as in
test_transformers_world_size.py) whose `train()` was interrupted with the processes at
different places: process 0 mid-epoch, process 1 at an epoch's end (a crash takes the
processes down one after the other). Both then `train(resume_from_checkpoint=...)` with
the same datasets (`restart_epoch` sends back only the iterator stopped mid-epoch): every
data epoch is trained exactly once over the two runs, with the steps left."""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.frameworks.hf_loops import write_tokens
from tests.frameworks.test_transformers_resume import _epochs, _Stop
from tests.frameworks.test_transformers_world_size import Recorder, _checkpoint, _trainer
from tests.runtime.helpers import unique_name

pytestmark = pytest.mark.ray

ROWS, BATCH, EPOCHS, SAVE = 48, 4, 3, 2  # 6 batches per rank and epoch


def _train_all(iterators: list, out: str, resume=None, stop=None) -> list[Recorder]:
    barrier = threading.Barrier(len(iterators))

    def train(rank: int, iterator) -> Recorder:
        trainer = _trainer(Recorder, iterator, rank, f"{out}/rank{rank}", SAVE, stop, barrier)
        with contextlib.suppress(_Stop):
            trainer.train(resume_from_checkpoint=resume)
        return trainer

    with ThreadPoolExecutor(len(iterators)) as pool:
        runs = [pool.submit(train, r, it) for r, it in enumerate(iterators)]
        return [run.result() for run in runs]


# (the checkpoint's step, batches process 0 / process 1 read on after it before the stop):
# mid-epoch 1, process 1 read to its end; epoch 1's end, process 0 began epoch 2.
@pytest.mark.parametrize("stop, more", [(8, (1, 4)), (12, (1, 0))])
def test_a_resume_after_processes_stopped_apart_is_exactly_once(ray_session, tmp_path, stop, more):
    data = write_tokens(str(tmp_path / "tokens"), ROWS, files=6)
    loader = Loader(ParquetSource(data), batch_size=BATCH, name=unique_name("hfmix"), shuffle=True)
    try:
        iterators = [loader.iterator(world_rank=r, world_size=2) for r in range(2)]
        first = _train_all(iterators, str(tmp_path / "first"), stop=stop)
        for iterator, count in zip(iterators, more):  # read on, batches never trained
            if count:
                list(itertools.islice(iter(iterator), count))
        resume = _checkpoint(str(tmp_path / "first"), 2, stop)
        second = _train_all(iterators, str(tmp_path / "second"), resume=resume)
    finally:
        loader.shutdown()
    assert [t.state.global_step for t in second] == [EPOCHS * 6] * 2
    got = _epochs(*(trainer.seen for trainer in [*first, *second]))
    assert sorted(got) == list(range(EPOCHS))
    for epoch in range(EPOCHS):
        assert collections.Counter(got[epoch]) == collections.Counter(range(ROWS)), epoch
