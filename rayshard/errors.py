"""The error family of rayshard.

Configuration mistakes found before any work starts are `ConfigError` (a `ValueError`), so
callers that already catch `ValueError` keep working. Failures at run time are
`RayshardError`s. Every message names the offending value, the rule and a way out.
"""

from __future__ import annotations

import copy
from typing import Any


class ConfigError(ValueError):
    """A configuration or input that cannot work, found before any data moved."""


class RayshardError(RuntimeError):
    """A failure while a loader runs (reading, coordinating, resuming)."""


class DataError(RayshardError):
    """Data that turned out unreadable while reading; names the file and the part of it."""


class ReadDeniedError(DataError):
    """The store refused to let a reader read a file (permissions); names the file."""


class StaleClientError(RayshardError):
    """A client spoke for an epoch or generation the coordinator has already left."""


def unwrap_task_error(error: Any, where: str) -> BaseException:
    """The rayshard error behind a Ray `RayTaskError` (e.g. a reader's `DataError`, the
    coordinator's `ConfigError`), as a new error of its own type whose message starts with
    `where` (loader, rank, epoch), so a training loop's `except DataError` catches it
    without Ray's remote traceback; anything else is returned as is. A task error raised
    through another task (a reader waiting on the coordinator) is unwrapped to the end."""
    cause = getattr(error, "cause", None)
    while _is_task_error(cause) and getattr(cause, "cause", None) is not None:
        cause = cause.cause
    if not isinstance(cause, (RayshardError, ConfigError)):
        return error
    try:
        unwrapped = copy.copy(cause)  # keeps a subclass's attributes (its __reduce__)
    except TypeError:  # a subclass that cannot be rebuilt: keep the family
        return RayshardError(f"{where}: {cause}")
    unwrapped.args = (f"{where}: {cause}", *cause.args[1:])
    return unwrapped


def _is_task_error(error: Any) -> bool:
    """Ray's `RayTaskError` and the dual classes it makes (`RayTaskError(DataError)`),
    without importing Ray here."""
    return any(cls.__name__ == "RayTaskError" for cls in type(error).__mro__)


def epoch_broken(cause: BaseException, epoch: int, received: int, length: int) -> RayshardError:
    """The error of iterating again after an error ended an epoch's batches: the epoch
    cannot go on in this iterator, and ending it there would skip the rest silently."""
    return RayshardError(
        f"epoch {epoch} stopped after {received} of {length} batches on {cause!r}; this "
        "iterator cannot go on with it (its batches after the error would be skipped): "
        "resume from a state_dict() taken now (load_state_dict on every rank, as after a "
        "restart)"
    )


def state_timed_out(core: Any, epoch: int, received: int, timeout_s: float) -> RayshardError:
    """`state_dict()` waited `state_timeout_s` for the other ranks' acknowledgements; the
    message names the ranks short of `received` batches of `epoch` and where they are
    (`core`: the coordinator's `CoordinatorCore`)."""
    counts = core.received.get(epoch, {})
    short = [
        f"rank {rank}: {counts.get(rank, 0)} acknowledged, "
        + ("no epoch begun" if (at := core.rank_epoch.get(rank)) is None else f"in epoch {at}")
        for rank in core.active_ranks()
        if counts.get(rank, 0) < min(received, core.total(epoch, rank))
    ]
    return RayshardError(
        f"not every rank acknowledged {received} batches of epoch {epoch} within "
        f"state_timeout_s={timeout_s} ({'; '.join(short) or 'none short now'}): call "
        "state_dict() at the same step of the same epoch on every rank, or raise "
        "state_timeout_s"
    )


def coordinator_gone(error: BaseException, coordinator: Any, where: str) -> RayshardError | None:
    """Ray's `ActorDiedError` of the loader's coordinator (`coordinator`: its handle) as a
    `RayshardError` saying so and what to do; None for any other error."""
    actor = getattr(error, "actor_id", None)  # (an `ActorDiedError`'s, as hex)
    if actor is None or actor != coordinator._actor_id.hex():
        return None
    return RayshardError(
        f"{where}: the loader's coordinator is gone ({type(error).__name__}): it died more "
        "often than coordinator_max_restarts allows, or its node ended, or the loader was "
        "shut down. This loader cannot go on: make a new Loader and restore the last "
        "checkpoint's state into its iterators (or raise coordinator_max_restarts)"
    )


def iterator_closed(where: str) -> RayshardError:
    """The error of iterating an iterator after its `close()` (or `Loader.shutdown()`)."""
    return RayshardError(
        f"{where}: this iterator was closed (close() or Loader.shutdown()) and yields no "
        "more batches; make a new one (Loader.iterator(), rayshard.train.iterator())"
    )


class TransformError(DataError):
    """A loader's transform failed (raised, or returned something unusable) in a reader.

    The message names the loader, data-parallel rank, epoch and the batch's sample indices
    and carries the transform's traceback; the same facts are attributes."""

    def __init__(
        self,
        message: str,
        loader: str = "",
        rank: int | None = None,
        epoch: int | None = None,
        samples: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.loader, self.rank, self.epoch, self.samples = loader, rank, epoch, samples

    def __reduce__(self):  # crosses actor boundaries: rebuild with every attribute
        return (type(self), (self.args[0], self.loader, self.rank, self.epoch, self.samples))


def same_kind(error: BaseException, message: str) -> RayshardError:
    """A new error of `error`'s rayshard type (or `RayshardError`) with `message`."""
    kind = type(error) if isinstance(error, RayshardError) else RayshardError
    try:
        return kind(message)
    except TypeError:  # a subclass with another constructor
        return RayshardError(message)
