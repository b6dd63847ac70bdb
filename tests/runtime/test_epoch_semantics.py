"""Epoch semantics a training framework can rely on: an epoch is finished once its
last batch has been yielded, whether or not the caller asks for one more; `iter()` fixes the
epoch it yields when it is called, and `len()` / `epoch` right after it describe exactly
that iteration; breaking out mid-epoch and iterating again continues the epoch.

Every way a framework drives an iterable is run here, each on its own epoch, on 1 and then 2
ranks, under a static policy and under `dynamic`: a full loop, `zip(range(len(it)), it)`
(Lightning's way: it stops at `len()`), `itertools.islice`, `next(iter(it))` probing, and
break-and-continue. Each epoch must cover the dataset exactly once."""

from __future__ import annotations

import itertools
import threading
from collections import Counter

import pytest
import torch

from rayshard.errors import StaleClientError
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import unique_name, write_parquet

pytestmark = pytest.mark.ray

SIZES = [37, 23, 40]  # 100 rows


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("epochs"), SIZES, row_group_size=10)


def _ids(batches) -> list[int]:
    out = []
    for batch in batches:
        ids, padded = batch["id"], batch["_padded"]
        if isinstance(ids, torch.Tensor):
            ids, padded = ids.numpy(), padded.numpy()
        out += ids[~padded].tolist()
    return out


def full_loop(it):
    gen = iter(it)
    length, epoch = len(it), it.epoch
    return epoch, length, list(gen)


def zip_len(it):
    length = len(it)  # what Lightning does: ask the length, then stop there
    epoch = it.epoch
    return epoch, length, [batch for _, batch in zip(range(length), it)]


def islice_len(it):
    length, epoch = len(it), it.epoch
    return epoch, length, list(itertools.islice(it, length))


def probe_then_loop(it):
    first = next(iter(it))  # a framework peeking at one batch, then the real loop
    epoch, length = it.epoch, len(it) + 1
    return epoch, length, [first, *list(itertools.islice(it, len(it)))]


def break_and_continue(it):
    gen = iter(it)
    length, epoch = len(it), it.epoch
    got = []
    for batch in gen:
        got.append(batch)
        if len(got) == length // 2:
            break
    assert it.epoch == epoch and len(it) == length - len(got), "a break must not end the epoch"
    rest = iter(it)
    assert it.epoch == epoch, "iterating again after a break continues the same epoch"
    return epoch, length, got + list(itertools.islice(rest, len(it)))


PATTERNS = [full_loop, zip_len, islice_len, probe_then_loop, break_and_continue]


def _run_rank(it, patterns, results, rank):
    out = []
    for pattern in patterns:
        epoch, length, batches = pattern(it)
        out.append(
            {
                "pattern": pattern.__name__,
                "epoch": epoch,
                "length": length,
                "yielded": len(batches),
                "ids": _ids(batches),
                "epoch_after": it.epoch,
            }
        )
    results[rank] = out


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_every_loop_shape_gets_every_epoch_exactly_once(ray_session, dataset, policy):
    loader = Loader(ParquetSource(dataset), batch_size=8, name=unique_name("ep"), policy=policy)
    # One rank for an epoch of each pattern, then two ranks (a new membership, at the next
    # epoch) for as many more.
    for world_size in (1, 2):
        first = (world_size - 1) * len(PATTERNS)
        _every_pattern_once(loader, world_size, first)
    loader.shutdown()


def _every_pattern_once(loader, world_size: int, first: int) -> None:
    """`world_size` ranks run every pattern, one epoch each from epoch `first`."""
    iterators = [loader.iterator(world_rank=r, world_size=world_size) for r in range(world_size)]
    # Rank r runs the patterns rotated by r, so on 2 ranks the two ranks of an epoch loop
    # differently (one stops at len(), the other asks for one more, ...).
    plans = [PATTERNS[r:] + PATTERNS[:r] for r in range(world_size)]
    results: dict = {}
    threads = [
        threading.Thread(target=_run_rank, args=(it, plan, results, r), daemon=True)
        for r, (it, plan) in enumerate(zip(iterators, plans))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert len(results) == world_size, "a rank did not finish its epochs"
    for step in range(len(PATTERNS)):
        epoch = first + step
        rows = [results[r][step] for r in range(world_size)]
        for row in rows:
            assert row["epoch"] == epoch, (row["pattern"], row["epoch"], epoch)
            assert row["yielded"] == row["length"], (row["pattern"], row)
            assert row["epoch_after"] == epoch + 1, (row["pattern"], "epoch not finished")
        ids = Counter(i for row in rows for i in row["ids"])
        assert ids == Counter(range(sum(SIZES))), (
            epoch,
            [row["pattern"] for row in rows],
            sorted(set(range(sum(SIZES))) - set(ids)),
        )
    # The state after the last batch points at the next epoch, nothing consumed.
    state = iterators[0].state_dict()
    assert state["epoch"] == first + len(PATTERNS) and state["consumed"] == []


class _CountingHandle:
    """The coordinator's handle, counting `length` calls (everything else passes through)."""

    def __init__(self, handle):
        self._handle, self.length_calls = handle, 0

    def __getattr__(self, name):
        if name == "length":
            self.length_calls += 1
        return getattr(self._handle, name)


def test_len_is_answered_without_a_remote_call_per_ask(ray_session, dataset):
    loader = Loader(ParquetSource(dataset), batch_size=8, name=unique_name("len"))
    it = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
    counting = _CountingHandle(it._coordinator)
    it._coordinator = counting
    first = [len(it) for _ in range(10)]  # before iter(): the next epoch's, asked once
    assert len(set(first)) == 1 and counting.length_calls == 1
    gen = iter(it)
    next(gen)
    assert [len(it) for _ in range(10)] == [first[0] - 1] * 10
    for _ in range(first[0] - 1):
        next(gen)
    assert it.epoch == 1  # finished at its last batch
    calls = counting.length_calls
    second = [len(it) for _ in range(10)]
    assert len(set(second)) == 1 and counting.length_calls == calls + 1
    loader.shutdown()


def test_state_after_last_batch_resumes_at_next_epoch_on_another_world(ray_session, dataset):
    """A loop that stops at len() and checkpoints (Lightning's epoch-end checkpoint) resumes
    at the next epoch, whole, also on another world size."""
    name = unique_name("res")
    loader = Loader(ParquetSource(dataset), batch_size=8, name=name)
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    length = len(it)
    assert len(list(itertools.islice(it, length))) == length
    state = it.state_dict()
    assert state["epoch"] == 1 and state["consumed"] == []
    loader.shutdown()
    again = Loader(ParquetSource(dataset), batch_size=8, name=name)
    iterators = [again.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in (0, 1)]
    for other in iterators:
        other.load_state_dict(state)
    assert all(other.epoch == 1 for other in iterators)
    ids = Counter(i for other in iterators for i in _ids(itertools.islice(other, len(other))))
    assert ids == Counter(range(sum(SIZES)))
    assert all(other.epoch == 2 for other in iterators)
    again.shutdown()


def _model_parallel_loader(dataset, policy: str, **options) -> Loader:
    """A loader of groups of two world ranks (`model_parallel_size=2`), batches of 8."""
    return Loader(
        ParquetSource(dataset),
        batch_size=8,
        name=unique_name("mp"),
        policy=policy,
        model_parallel_size=2,
        **options,
    )


def _run_threads(iterators, barrier=None) -> list[list]:
    """Each iterator read to the end of its epoch in a thread of its own (as ranks do),
    all calling `iter()` at once past `barrier` if given: every rank's batches."""
    got: list = [None] * len(iterators)

    def run(rank):
        if barrier is not None:
            barrier.wait()  # as a collective would: every member starts the epoch together
        got[rank] = list(iter(iterators[rank]))

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(len(got))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(g is not None for g in got), "a rank hung"
    return got


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_model_parallel_members_starting_together_or_making_new_iterators(
    ray_session, dataset, policy
):
    """Model-parallel groups of two (`model_parallel_size=2`) on 4 ranks. Epochs 0 and 1:
    the members of each group call `iter()` at the same moment (a barrier releases all
    four ranks at once) on the same iterators: nobody hangs. Epoch 2: every rank makes a
    new iterator (as a loop per epoch, or a restarted group, does): the members of a group
    get one new reader between them (one each left both waiting for the other forever) and
    the epochs go on (they stayed at 0). Every epoch the members of a group receive
    identical batches and the groups cover the dataset once."""
    loader = _model_parallel_loader(dataset, policy, batches_per_object=1, shuffle=True)
    world = 4
    its = [loader.iterator(world_rank=r, world_size=world, batch_format="numpy") for r in range(4)]
    seen = []
    for epoch in range(3):
        if epoch == 2:
            for it in its:
                it.close()
            its = [
                loader.iterator(world_rank=r, world_size=world, batch_format="numpy")
                for r in range(4)
            ]
        assert [it.epoch for it in its] == [epoch] * 4
        assert (
            its[0]._holds.reader._actor_id
            == its[1]._holds.reader._actor_id
            != its[2]._holds.reader._actor_id
        )
        barrier = threading.Barrier(world, timeout=120)
        got = [_ids(batches) for batches in _run_threads(its, barrier)]
        assert got[0] == got[1] and got[2] == got[3]
        assert Counter(got[0] + got[2]) == Counter(range(sum(SIZES)))
        seen.append(got[0])
    assert seen[0] != seen[1] or seen[1] != seen[2]  # shuffled anew: not epoch 0 each time
    loader.shutdown()


def test_dynamic_loader_kept_over_a_smaller_group_plans_for_the_smaller_group(ray_session, dataset):
    """A Train group of 3 shrinks to 2 while the loader (and its coordinator) lives on: the
    new ranks' lengths are exact and equal, and the rest of the epoch is read once."""
    loader = Loader(ParquetSource(dataset), batch_size=8, name=unique_name("shr"), policy="dynamic")
    old = [loader.iterator(world_rank=r, world_size=3, batch_format="numpy") for r in range(3)]
    gens = [iter(it) for it in old]
    first = [int(i) for g in gens for i in next(g)["_index"]]
    state = old[0].state_dict()
    for it in old:
        it.close()
    new = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    for it in new:
        it.load_state_dict(state)
    lengths = [len(it) for it in new]
    batches = _run_threads(new)
    assert [len(b) for b in batches] == lengths  # exact len(), as for every policy
    rest = _ids(batches[0]) + _ids(batches[1])
    assert Counter(first + rest) == Counter(range(sum(SIZES)))
    assert lengths[0] == lengths[1] and loader.stats()["dp_size"] == 2
    loader.shutdown()


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_a_new_iterator_for_a_rank_replaces_the_old_one_which_takes_nothing_after(
    ray_session, dataset, policy
):
    """A second iterator for the same rank in one process (a loop or a framework making a
    new one mid-epoch) takes the rank over: the old one, left open, yields and leases
    nothing more (under `dynamic` its read-ahead used to lease rows the new one then never
    got), and closing it late does not remove the new one from the loader."""
    loader = Loader(ParquetSource(dataset), batch_size=8, name=unique_name("rep"), policy=policy)
    old = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    old_batches = iter(old)
    delivered = _ids([next(old_batches)])  # its acknowledgement may not have been sent yet
    new = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    rest = _ids(list(new))
    assert len(rest) == len(set(rest))  # the new iterator repeats nothing of its own
    assert set(delivered + rest) == set(range(sum(SIZES)))  # and leaves nothing out
    if policy == "dynamic":  # the rest of the shared epoch (what the old one received
        # and had not acknowledged yet may come again: its rows went back to the queue)
        assert {i for i, n in Counter(delivered + rest).items() if n > 1} <= set(delivered)
    else:  # the rank's epoch from its start, as `set_epoch` in its middle reads it
        assert Counter(rest) == Counter(range(sum(SIZES)))
    # Superseded, the old one yields nothing more, not even what it read ahead (under
    # `dynamic` its leases went back to the queue for the new one; a static one would read
    # on through the plan the new one reads: tests/runtime/test_stale_iterators.py).
    with pytest.raises(StaleClientError, match="newer iterator of data-parallel rank 0"):
        next(old_batches)
    old.close()
    assert loader.stats()["ranks"] == [0]
    assert Counter(_ids(list(new))) == Counter(range(sum(SIZES)))  # the next epoch, whole
    loader.shutdown()
