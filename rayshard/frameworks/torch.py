"""torch `DataLoader` and Accelerate over rayshard: a thin `IterableDataset` adapter.

    loader_dl = rayshard.frameworks.torch.dataloader(rayshard.train.iterator(loader))
    for batch in loader_dl:  # rayshard's batches as they are: no second batching
        ...

rayshard batches rows already (per rank), so the `DataLoader` must pass batches through:
`batch_size=None` and `num_workers=0`. A `DataLoader` worker process would read the rank's
whole shard again (every worker gets a copy of the dataset), so the adapter refuses to be
iterated in one. Accelerate: do not `prepare()` this `DataLoader`: in a multi-process run
Accelerate would split each rank's batches once more over the processes (or read them all
on rank 0 and dispatch); it is per rank already, and such an iteration raises a
`ConfigError`. In one process its wrapper reads a batch ahead, which a `state_dict()` then
counts (a warning says so). Prepare the model and optimizer only.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch.utils.data

from rayshard.errors import ConfigError

PREPARED_WRAPPERS = {"DataLoaderShard", "DataLoaderDispatcher", "IterableDatasetShard"}
ACCELERATE_PREPARED = (
    "rayshard's DataLoader was passed to Accelerate's prepare(), which {what}. rayshard "
    "batches per rank already: prepare the model and optimizer only, and iterate the "
    "DataLoader as rayshard.frameworks.torch.dataloader(iterator) made it"
)


class IterableAdapter(torch.utils.data.IterableDataset):
    """A rayshard iterator as a torch `IterableDataset`: `iter()` yields the iterator's
    batches (through `transform` if given), `len()` is `len(iterator)` (batches the next
    iteration yields), `state_dict()`/`load_state_dict()` are the loader's."""

    def __init__(self, iterator: Any, transform: Callable[[dict], Any] | None = None) -> None:
        super().__init__()
        self.iterator = iterator
        self.transform = transform
        self.warned_prepared = False  # (Accelerate's one-process wrapper: warned once)

    def __iter__(self) -> Iterator[Any]:
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(
                "rayshard's IterableAdapter was iterated in a DataLoader worker process: each"
                " worker would read this rank's whole shard again. rayshard reads and batches in"
                " its own actors; use DataLoader(adapter, batch_size=None, num_workers=0)"
                " (or rayshard.frameworks.torch.dataloader(iterator))"
            )
        _check_not_prepared(self)
        batches = iter(self.iterator)
        if self.transform is None:
            return batches
        return (self.transform(batch) for batch in batches)

    def __len__(self) -> int:
        return len(self.iterator)

    def state_dict(self) -> dict:
        return self.iterator.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.iterator.load_state_dict(state)


def _check_not_prepared(adapter: IterableAdapter) -> None:
    """Refuse an iteration by Accelerate's `prepare()`d wrapper over several processes: it
    splits each rank's batches over them again (or reads rank 0's only and dispatches
    them), so each epoch silently loses or repeats rows. In one process, warn once: its
    wrapper reads a batch ahead, which a `state_dict()` counts (a resume skips it)."""
    processes = _accelerate_processes()
    if processes is None:
        return
    if processes > 1:
        what = (
            f"re-shards each rank's batches over its {processes} processes (or reads rank "
            "0's alone and dispatches them): each epoch would lose or repeat rows"
        )
        raise ConfigError(ACCELERATE_PREPARED.format(what=what))
    if not adapter.warned_prepared:
        adapter.warned_prepared = True
        what = (
            "reads a batch ahead of the loop: a state_dict() taken at step k counts batch "
            "k+1, and a resume from it skips that batch"
        )
        warnings.warn(ACCELERATE_PREPARED.format(what=what), RuntimeWarning, stacklevel=3)


def _accelerate_processes() -> int | None:
    """The processes of the `prepare()` wrapper this iteration runs in (its data loader,
    dispatcher or dataset shard, found on the call stack), or None: not Accelerate's
    (its `skip_first_batches` wrapper, which a Trainer's resume may use, is not one)."""
    found, frame = None, sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")  # (a frame's locals read only there:
        owner = frame.f_locals.get("self") if module.startswith("accelerate.") else None
        if type(owner).__name__ in PREPARED_WRAPPERS:  # reading keeps a caller's alive)
            state = getattr(owner, "state", None)  # (a dispatcher's `PartialState`)
            counts = (getattr(owner, "num_processes", None), getattr(state, "num_processes", 0))
            found = max(found or 1, *(int(n) for n in counts if isinstance(n, int)))
        frame = frame.f_back
    return found


def dataloader(
    iterator: Any, transform: Callable[[dict], Any] | None = None, **kwargs: Any
) -> torch.utils.data.DataLoader:
    """`DataLoader(IterableAdapter(iterator, transform), batch_size=None)`: batches pass
    through as rayshard made them. `batch_size` other than None and `num_workers > 0` are
    refused (see the module docstring); other `DataLoader` arguments pass on."""
    if kwargs.get("batch_size") is not None:
        raise ValueError(
            f"batch_size={kwargs['batch_size']!r}: rayshard batches already"
            " (Loader(batch_size=...));"
            " the DataLoader must pass them through with batch_size=None"
        )
    if kwargs.get("num_workers", 0):
        raise ValueError(
            f"num_workers={kwargs['num_workers']!r}: each DataLoader worker would read this"
            " rank's whole shard again; rayshard reads in its own actors, use num_workers=0"
            " (raise Loader(reader_threads=...) or prefetch_depth for more read-ahead)"
        )
    kwargs.pop("batch_size", None)
    return torch.utils.data.DataLoader(
        IterableAdapter(iterator, transform), batch_size=None, **kwargs
    )


__all__ = ["IterableAdapter", "dataloader"]
