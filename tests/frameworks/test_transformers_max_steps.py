"""Hugging Face `Trainer` over rayshard: `max_steps` that ends mid-epoch, then `train()`
again with a larger `max_steps`, resuming from the last checkpoint (the one saved at
`max_steps`), with the same dataset (as in a notebook) or a new loader (a new job). Every
data epoch is trained exactly once over the runs; each run ends at its `max_steps`."""

from __future__ import annotations

import collections

import pytest

from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.frameworks.hf_loops import write_tokens
from tests.frameworks.test_transformers_world_size import Recorder, _trainer
from tests.runtime.helpers import unique_name

pytestmark = pytest.mark.ray

ROWS, BATCH = 48, 8  # 6 batches per epoch
RUNS = (9, 15, 18)  # max_steps of each train(): mid epoch 1, mid epoch 2, epoch 2's end


# accumulate 2: 3 optimizer steps per epoch
@pytest.mark.parametrize("same_dataset, accumulate", [(True, 1), (False, 2)])
def test_a_larger_max_steps_resumes_where_the_last_stopped(
    ray_session, tmp_path, same_dataset, accumulate
):
    data = write_tokens(str(tmp_path / "tokens"), ROWS, files=6)
    name = unique_name("hfmax")

    def loader() -> Loader:
        return Loader(
            ParquetSource(data),
            batch_size=BATCH,
            name=name,
            shuffle=True,
            namespace=unique_name("hfmax-job"),
        )

    loaders = [loader()]
    iterator = loaders[0].iterator(world_rank=0, world_size=1)
    got: dict[int, list[int]] = collections.defaultdict(list)
    try:
        for index, steps in enumerate(RUNS):
            if index and not same_dataset:
                loaders.append(loader())
                iterator = loaders[-1].iterator(world_rank=0, world_size=1)
            max_steps = steps // accumulate
            trainer = _trainer(Recorder, iterator, 0, str(tmp_path / "out"), 4, None)
            trainer.args.max_steps = max_steps
            trainer.args.gradient_accumulation_steps = accumulate
            trainer.train(resume_from_checkpoint=bool(index))
            assert trainer.state.global_step == max_steps, (steps, trainer.state.global_step)
            for epoch, ids in trainer.seen:
                got[epoch] += ids
            assert sum(len(ids) for ids in got.values()) == max_steps * accumulate * BATCH
    finally:
        for each in loaders:
            each.shutdown()
    assert sorted(got) == [0, 1, 2]
    for epoch in range(3):
        assert collections.Counter(got[epoch]) == collections.Counter(range(ROWS)), epoch
