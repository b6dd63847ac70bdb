"""An iteration cut short by an interrupt (Ctrl-C in a notebook) or an error loses no
sample: an epoch that failed to start is started again by the next `iter()`, a loop
interrupted while it waits for a batch goes on where it was, a stream an interrupt ended
refuses to go on, and a closed iterator says so. Real local Ray, real Parquet files; the
interrupts are raised where a real one lands (the epoch's start, the wait for a batch)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from rayshard.errors import RayshardError
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import unique_name, write_parquet
from tests.timeouts import wait_until

ROWS = [40, 35, 26]  # 101 rows, row groups of 7
ALL = list(range(sum(ROWS)))


def _loader(tmp_path, **options) -> Loader:
    options = {"shuffle": True, "seed": 3, **options}
    source = ParquetSource(write_parquet(tmp_path, ROWS))
    return Loader(source, batch_size=8, name=unique_name("interrupt"), **options)


def _ids(batch) -> list[int]:
    return np.asarray(batch["_index"]).tolist()


def _real_ids(batch) -> list[int]:
    return np.asarray(batch["_index"])[~np.asarray(batch["_padded"])].tolist()


def _interrupt_once(target, name: str, at_call: int, monkeypatch) -> None:
    """`target.name(...)` raises `KeyboardInterrupt` at its `at_call`-th call, else runs."""
    real, calls = getattr(target, name), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, interrupted)


def _interrupt_first_wait(acks, monkeypatch) -> None:
    """`acks.flush(wait=True)` (the epoch's end waits for its acknowledgements) raises
    `KeyboardInterrupt` the first time; other flushes run."""
    real, waits = acks.flush, []

    def interrupted(wait: bool = False) -> None:
        waits.append(wait)
        if wait and waits.count(True) == 1:
            raise KeyboardInterrupt
        real(wait=wait)

    monkeypatch.setattr(acks, "flush", interrupted)


def _read_to_an_interrupt_at_the_last_batch(it, where: str, monkeypatch) -> list[list[int]]:
    """Iterate `it` until the wait for its last batch's acknowledgement (`flush`) or, under
    `dynamic`, the re-read of its step count (`length`) is interrupted; the ids read."""
    total, got = len(it), []
    with pytest.raises(KeyboardInterrupt):
        for batch in it:
            got.append(_ids(batch))
            if len(got) == total - 1 and where == "length":
                _interrupt_once(it, "_current_length", 1, monkeypatch)
            if len(got) == total - 1 and where == "flush":
                _interrupt_first_wait(it._acks, monkeypatch)
    return got


@pytest.mark.ray
def test_an_epoch_that_failed_to_start_is_started_again_not_skipped(
    ray_session, tmp_path, monkeypatch
):
    loader = _loader(tmp_path)
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    try:
        assert sorted(i for b in it for i in _ids(b)) == ALL  # epoch 0
        asked, start = [], it._local.start

        def start_interrupted_once(generation, epoch, *args):
            asked.append(epoch)
            if len(asked) == 1:
                raise KeyboardInterrupt  # while the coordinator plans epoch 1
            return start(generation, epoch, *args)

        monkeypatch.setattr(it._local, "start", start_interrupted_once)
        with pytest.raises(KeyboardInterrupt):
            iter(it)
        assert it.epoch == 1
        assert sorted(i for b in it for i in _ids(b)) == ALL
        assert asked == [1, 1]  # epoch 1 again, not epoch 2
        assert it.epoch == 2
    finally:
        loader.shutdown()


class _InterruptedOnce:
    """A `collate_fn` that is interrupted (Ctrl-C) at its `at_call`-th call."""

    def __init__(self, at_call: int) -> None:
        self.at_call, self.calls = at_call, 0

    def __call__(self, batch):
        self.calls += 1
        if self.calls == self.at_call:
            raise KeyboardInterrupt
        return batch


@pytest.mark.ray
@pytest.mark.parametrize("batch_format", ["numpy", "torch"])
@pytest.mark.parametrize("where", ["wait", "hand-over"])
def test_a_loop_interrupted_in_next_goes_on_where_it_was(
    ray_session, tmp_path, monkeypatch, batch_format, where
):
    loader = _loader(tmp_path)
    converting = (
        _InterruptedOnce(at_call=5) if (where, batch_format) == ("hand-over", "numpy") else None
    )
    it = loader.iterator(
        world_rank=0, world_size=1, batch_format=batch_format, collate_fn=converting
    )
    try:
        got = []
        with pytest.raises(KeyboardInterrupt):
            for batch in it:
                got.append(_ids(batch))
                if len(got) == 4 and where == "wait":  # before the 5th batch is taken
                    channel = it._feed._channel if batch_format == "torch" else it._local._channel
                    _interrupt_once(channel, "get", 1, monkeypatch)
                if len(got) == 4 and (where, batch_format) == ("hand-over", "torch"):
                    _interrupt_once(it._feed._stager, "deliver", 1, monkeypatch)  # taken
        assert len(got) == 4
        got.extend(_ids(batch) for batch in it)  # the same epoch, from the 5th batch
        assert sorted(i for ids in got for i in ids) == ALL
        assert it.epoch == 1
    finally:
        loader.shutdown()


@pytest.mark.ray
@pytest.mark.parametrize(
    "policy, where", [("data", "flush"), ("dynamic", "flush"), ("dynamic", "length")]
)
def test_a_loop_interrupted_while_its_last_batch_is_recorded_gets_it_next(
    ray_session, tmp_path, monkeypatch, policy, where
):
    """The epoch's last batch is received, then the wait for its acknowledgement (or,
    under `dynamic`, the re-read of the step count) is interrupted: the next loop yields
    that batch and ends the epoch; the epoch after is whole."""
    loader = _loader(tmp_path, policy=policy)
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    try:
        total, got = len(it), _read_to_an_interrupt_at_the_last_batch(it, where, monkeypatch)
        assert len(got) == total - 1 and len(it) == 1 and it.epoch == 0
        got.extend(_ids(batch) for batch in it)  # the held last batch, then the end
        assert len(got) == total and sorted(i for ids in got for i in ids) == ALL
        assert it.epoch == 1
        assert sorted(i for b in it for i in _ids(b)) == ALL  # epoch 1, whole
    finally:
        loader.shutdown()


@pytest.mark.ray
@pytest.mark.parametrize(
    "policy, where", [("data", "flush"), ("dynamic", "flush"), ("dynamic", "length")]
)
def test_a_restart_of_the_epoch_after_an_interrupt_held_its_last_batch_loses_it_not(
    ray_session, tmp_path, monkeypatch, policy, where
):
    """As above, then the loop calls `set_epoch` with the same epoch (a notebook cell run
    again). A static policy reads the epoch again from its start; under `dynamic` the held
    batch is acknowledged (in no one's rest): the restarted loop yields it, then the rest."""
    loader = _loader(tmp_path, policy=policy)
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    try:
        total, got = len(it), _read_to_an_interrupt_at_the_last_batch(it, where, monkeypatch)
        assert len(got) == total - 1
        it.set_epoch(0)
        it.set_epoch(0)  # (again before iterating: the held batch stays carried)
        expected = len(it)
        again = [_real_ids(batch) for batch in it]
        assert len(again) == expected and it.epoch == 1
        if policy == "dynamic":  # (then padding to the epoch's steps, marked)
            got.extend(again)
            assert sorted(i for ids in got for i in ids) == ALL  # every row once
        else:
            assert sorted(i for ids in again for i in ids) == ALL
        assert sorted(i for b in it for i in _ids(b)) == ALL  # epoch 1, whole
    finally:
        loader.shutdown()


@pytest.mark.ray
def test_a_stream_an_interrupt_ended_refuses_to_go_on(ray_session, tmp_path):
    loader = _loader(tmp_path, consumer_reads=False)  # fetched from the reader actor
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    try:
        loop = iter(it)
        first = _ids(next(loop))
        raw = it._stream._raw

        def ended_by_an_interrupt():  # the fetching generator, as an interrupt leaves it
            yield next(raw)
            raise KeyboardInterrupt

        it._stream._raw = ended_by_an_interrupt()
        second = _ids(next(loop))
        with pytest.raises(KeyboardInterrupt):
            next(loop)
        with pytest.raises(RayshardError, match="stopped after 2 of"):
            iter(it)  # not an epoch silently ended short
        assert len(set(first + second)) == 16
    finally:
        loader.shutdown()


@pytest.mark.ray
def test_a_closed_iterator_says_so(ray_session, tmp_path):
    loader = _loader(tmp_path)
    try:
        it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        loop = iter(it)
        next(loop)
        it.close()
        with pytest.raises(RayshardError, match="was closed"):
            next(loop)
        with pytest.raises(RayshardError, match="was closed"):
            iter(it)
    finally:
        loader.shutdown()


@pytest.mark.ray
@pytest.mark.parametrize(
    "policy, consumer_reads", [("data", None), ("dynamic", None), ("data", False)]
)
def test_a_dropped_iterator_records_what_it_received_and_its_thread_ends(
    ray_session, tmp_path, policy, consumer_reads
):
    loader = _loader(tmp_path, policy=policy, consumer_reads=consumer_reads)
    try:
        it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        loop = iter(it)
        for _ in range(5):
            next(loop)
        thread = it._acks._thread
        del it, loop  # not closed: a loop that makes an iterator per epoch
        gc.collect()
        wait_until(lambda: not thread.is_alive(), "the dropped iterator's acknowledgements")

        def received() -> tuple:  # sent as it ended (recorded in the order sent)
            counts = loader.stats()["consumers"].get(0, {})
            return counts.get("batches"), counts.get("samples")

        wait_until(lambda: received() == (5, 40), "the dropped loop's batches recorded")
    finally:
        loader.shutdown()


@pytest.mark.ray
def test_an_iterator_closed_while_its_loop_waits_says_so(ray_session, tmp_path, monkeypatch):
    loader = _loader(tmp_path)
    try:
        it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        loop = iter(it)
        next(loop)
        channel = it._local._channel
        get = channel.get

        def closed_meanwhile(*args, **kwargs):  # another thread's close() during the wait
            it.close()
            return get(*args, **kwargs)

        monkeypatch.setattr(channel, "get", closed_meanwhile)
        with pytest.raises(RayshardError, match="was closed"):
            next(loop)  # not the epoch's end
    finally:
        loader.shutdown()


@pytest.mark.ray
def test_a_stop_iteration_from_collate_fn_is_an_error_not_the_epochs_end(ray_session, tmp_path):
    def collate(batch):
        raise StopIteration  # a user's bug: it must not read as the end of the epoch

    loader = _loader(tmp_path)
    try:
        it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy", collate_fn=collate)
        with pytest.raises(RuntimeError, match="StopIteration"):
            next(iter(it))
        with pytest.raises(RayshardError, match="stopped after 0 of"):
            iter(it)  # the epoch is broken, not ended with nothing read
    finally:
        loader.shutdown()
