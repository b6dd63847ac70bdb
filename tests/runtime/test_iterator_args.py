"""`Loader.iterator`'s arguments, checked without Ray before the rank registers
(`rayshard.runtime.iterator_args`); tests/runtime/test_loader_static.py checks that the
loader runs the check before any remote call."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from rayshard.errors import ConfigError
from rayshard.runtime.iterator_args import check_iterator_args

GOOD = {"world_rank": 0, "world_size": 2, "batch_format": "numpy", "device": None}


def check(**changes):
    args = {**GOOD, "collate_fn": None, **changes}
    return check_iterator_args(
        args["world_rank"], args["world_size"], args["batch_format"], args["device"],
        args["collate_fn"],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"world_rank": 0.5}, "world_rank=0.5 must be an integer >= 0"),
        ({"world_rank": "0"}, "world_rank='0' must be an integer >= 0"),
        ({"world_rank": True}, "world_rank=True must be an integer >= 0"),
        ({"world_rank": -1}, "world_rank=-1 is not in the range world_rank>=0"),
        ({"world_size": 2.0}, "world_size=2.0 must be an integer >= 1"),
        ({"world_size": "2"}, "world_size='2' must be an integer >= 1"),
        ({"world_size": True}, "world_size=True must be an integer >= 1"),
        ({"batch_format": "pandas"}, "batch_format='pandas' is not a valid choice: use one of"),
        ({"batch_format": ["numpy"]}, "batch_format=['numpy'] is not a valid choice"),
        ({"device": "bogus"}, "device='bogus' is not a torch device (Expected one of"),
        ({"device": 1.5}, "device=1.5 is not a torch device"),
    ],
)
def test_bad_arguments_are_config_errors_naming_them(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check(**changes)


def test_good_arguments_pass_as_ints():
    assert check() == (0, 2)
    rank, size = check(world_rank=np.int64(1), world_size=np.int32(2))
    assert (rank, size) == (1, 2) and type(rank) is int and type(size) is int
    for device in ("cpu", torch.device("cpu")):
        check(batch_format="torch", device=device)
    with pytest.raises(TypeError, match="collate_fn='x' is not callable"):
        check(collate_fn="x")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_a_cuda_device_without_cuda_fails_at_iterator_not_at_the_first_batch(device):
    # the iterator is made in the process that uses it: no CUDA there is known at once
    with pytest.raises(ConfigError, match=r"device='cuda(:\d)?' but CUDA is not available"):
        check(batch_format="torch", device=device)


@pytest.mark.parametrize("device", ["mps", "xpu"])
def test_a_device_this_torch_build_lacks_fails_at_iterator_not_at_the_first_batch(device):
    backend = getattr(torch, device, None)
    if backend is not None and backend.is_available():
        pytest.skip(f"this machine has {device}")
    with pytest.raises(ConfigError, match=rf"device='{device}' is not available to this torch"):
        check(batch_format="torch", device=device)
    check(batch_format="torch", device="meta")  # (no memory, but a real device: allowed)


def test_a_date_column_under_torch_is_refused_at_iterator_not_at_the_first_batch():
    import pyarrow as pa

    from rayshard.runtime.iterator_args import check_torch_columns

    schema = pa.schema([("x", pa.float32()), ("when", pa.timestamp("us")), ("t", pa.time64("us"))])
    with pytest.raises(
        ConfigError, match=r"column 'when' \(timestamp\[us\]\) cannot become a torch"
    ):
        check_torch_columns(schema, "torch", None)
    check_torch_columns(schema, "numpy", None)  # numpy datetime64, as read
    check_torch_columns(schema, "torch", lambda batch: batch)  # the collate_fn converts it
    check_torch_columns(pa.schema([("t", pa.time64("us"))]), "torch", None)  # Python lists
