"""A plain Ray Train loop over `rayshard.train` (importable in the workers as
`tests.frameworks.train_glue_loops`): an iterator taken per epoch for a training loader
and a validation loader, a checkpoint with both loaders' states reported mid-epoch."""

from __future__ import annotations

import json
import os
import tempfile

import ray.train

import rayshard.train


def iterator_per_epoch_loop(config: dict) -> None:
    """Each epoch: a new training iterator, read whole with a checkpoint every `every`
    batches (both loaders' states, under their own names), then a new validation
    iterator, read whole. Writes what each iterator read to `out/rank<r>.json`."""
    rank = ray.train.get_context().get_world_rank()
    seen: list[dict] = []
    steps = 0
    for _ in range(config["epochs"]):
        batches = rayshard.train.iterator(config["loader"], batch_format="numpy")
        epoch, ids = batches.epoch, []
        for batch in batches:
            ids += batch["id"][~batch["_padded"]].tolist()
            steps += 1
            if steps % config["every"] == 0:
                with tempfile.TemporaryDirectory() as folder:
                    rayshard.train.save_state(batches, folder)
                    if seen:  # the validation loader has a state once it was read
                        rayshard.train.save_state(val, folder, name="val")  # noqa: F821
                    ray.train.report({}, checkpoint=ray.train.Checkpoint.from_directory(folder))
        val = rayshard.train.iterator(config["val"], batch_format="numpy", state_name="val")
        val_epoch = val.epoch
        val_ids = [i for b in val for i in b["id"][~b["_padded"]].tolist()]
        seen.append({"epoch": epoch, "ids": ids, "val_epoch": val_epoch, "val_ids": val_ids})
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as stream:
        json.dump(seen, stream)
