"""Training pieces run inside Ray Train workers (importable there as `tests.runtime...`)."""

from __future__ import annotations

import ray
import torch


class DdpModel:
    """A linear model under DDP, one optimizer step per (numpy) batch, padding rows masked
    out of the loss. Its backward is an all-reduce: ranks with unequal step counts hang."""

    def __init__(self) -> None:
        self.model = ray.train.torch.prepare_model(torch.nn.Linear(4, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def step(self, batch: dict) -> None:
        real = torch.from_numpy(~batch["_padded"])
        loss = ((self.model(torch.from_numpy(batch["x"])).squeeze(1) * real) ** 2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
