"""Training loops run inside Ray Train workers (importable there as `tests.runtime...`)."""

from __future__ import annotations

import tempfile

import ray
import torch
from ray.train import Checkpoint

import rayshard.train


def ddp_loop(config):
    """DDP over rayshard; every received id goes to the audit actor."""
    batches = rayshard.train.iterator(config["loader"])
    model = ray.train.torch.prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    context = ray.train.get_context()
    while batches.epoch < config["epochs"]:
        epoch, steps = batches.epoch, 0
        for batch in batches:
            real = ~batch["_padded"]
            loss = ((model(batch["x"]).squeeze(1) * real) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduce: hangs if ranks had unequal steps
            optimizer.step()
            config["audit"].add.remote(epoch, batch["id"][real].numpy())
            steps += 1
        with tempfile.TemporaryDirectory() as folder:
            state = rayshard.train.save_state(batches, folder)
            ray.train.report(
                {
                    "epoch": epoch,
                    "steps": steps,
                    "rank": context.get_world_rank(),
                    "state_epoch": state["epoch"],
                },
                checkpoint=Checkpoint.from_directory(folder),
            )
