"""Accelerate's `prepare()` over rayshard's `DataLoader` is refused where it would lose or
repeat rows: over several processes its wrapper splits each rank's batches again, or
dispatches rank 0's alone (each epoch silently halved before). Real Accelerate: two
processes in a real gloo group, as `accelerate launch` starts them."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing

from rayshard.errors import ConfigError
from rayshard.frameworks.torch import IterableAdapter

accelerate = pytest.importorskip("accelerate")


def _prepared_in_a_group(index: int, port: int, out: str) -> None:
    """Process `index` of 2 (as `accelerate launch` starts them): prepare and iterate."""
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE="2")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    accelerator = accelerate.Accelerator(cpu=True)
    # (the rows do not matter: the refusal comes before the adapter's iterator is read)
    batches = [{"id": torch.arange(4 * i, 4 * i + 4)} for i in range(6)]
    prepared = accelerator.prepare(torch.utils.data.DataLoader(IterableAdapter(batches), None))
    try:
        outcome = f"read {[b['id'].tolist() for b in prepared]}"
    except ConfigError as error:
        outcome = f"ConfigError: {error}"
    with open(os.path.join(out, f"{index}.txt"), "w") as file:
        file.write(f"{accelerator.num_processes} {type(prepared).__name__}\n{outcome}")


def test_prepare_over_two_processes_is_refused_in_each(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torch.multiprocessing.start_processes(
        _prepared_in_a_group, args=(port, str(tmp_path)), nprocs=2, start_method="spawn"
    )
    for index in range(2):
        made, outcome = (tmp_path / f"{index}.txt").read_text().split("\n", 1)
        assert made == "2 DataLoaderDispatcher"  # (Accelerate's default for an iterable)
        assert outcome.startswith("ConfigError: rayshard's DataLoader was passed to")
        assert "its 2 processes" in outcome and "prepare the model and optimizer" in outcome
