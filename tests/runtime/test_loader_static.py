"""Static policies over real Parquet on a real local Ray: coverage, equal steps, exact len,
determinism, rotation as `rayshard plan` says, resume, namespaces, stale clients."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from click.testing import CliRunner

from rayshard.cli import main as cli
from rayshard.config.loader_config import LoaderConfig
from rayshard.errors import ConfigError, RayshardError, StaleClientError
from rayshard.loader import Loader
from rayshard.plan import intervals as iv
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, run_lockstep, unique_name, watch_of, write_parquet
from tests.timeouts import EVENT_TIMEOUT_S, wait_until

pytestmark = pytest.mark.ray

SIZES = [23, 17, 31, 9, 20]  # 100 rows, uneven files, row groups of 7


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("static"), SIZES)


def make_loader(dataset, **options):
    options.setdefault("batch_size", 8)
    return Loader(ParquetSource(dataset), name=unique_name(), **options)


@pytest.mark.parametrize("policy", ["data", "file", "file_or_data"])
def test_one_epoch_covers_dataset_with_equal_steps(ray_session, dataset, policy):
    # One loader, one world size after the other (each a new membership at the next
    # epoch, read whole): every world size's epoch covers the dataset in equal steps.
    loader = make_loader(dataset, policy=policy, uneven="unbalanced")
    for epoch, world_size in enumerate([1, 2, 3]):
        iterators = [
            loader.iterator(world_rank=r, world_size=world_size, batch_format="numpy")
            for r in range(world_size)
        ]
        assert [it.epoch for it in iterators] == [epoch] * world_size
        lengths = [len(it) for it in iterators]
        batches = run_lockstep(iterators)
        assert [len(b) for b in batches] == lengths, f"len() must equal the batches {world_size}"
        assert len(set(lengths)) == 1, f"unequal steps {lengths} on {world_size} ranks"
        ids = [i for rank in batches for i in real_ids(rank)]
        assert Counter(ids) == Counter(range(sum(SIZES))), f"world size {world_size}"
    loader.shutdown()


def test_drop_policy_drops_exactly_what_plan_says(ray_session, dataset):
    loader = make_loader(dataset, last_batch="drop", batch_size=8)
    iterators = [
        loader.iterator(world_rank=r, world_size=3, batch_format="numpy") for r in range(3)
    ]
    batches = run_lockstep(iterators)
    assert all(len(b["id"]) == 8 for rank in batches for b in rank)
    # 100 samples over 3 ranks: shards 33/33/34 -> 4 full batches each, 4 dropped in all.
    ids = [i for rank in batches for i in real_ids(rank)]
    assert len(ids) == len(set(ids)) == 96
    loader.shutdown()


@pytest.mark.parametrize(
    "shuffling", [{"shuffle": True}, {"shuffle_buffer": 16}, {"shuffle_blocks": 16}]
)
def test_drop_with_shuffling_leaves_out_other_samples_every_epoch(ray_session, dataset, shuffling):
    loader = make_loader(dataset, last_batch="drop", batch_size=8, **shuffling)
    iterators = [
        loader.iterator(world_rank=r, world_size=3, batch_format="numpy") for r in range(3)
    ]
    left_out = []
    for _ in range(4):
        ids = [i for rank in run_lockstep(iterators) for i in real_ids(rank)]
        assert len(ids) == len(set(ids)) == 96  # still 4 full batches a rank
        left_out.append(frozenset(range(100)) - set(ids))
    # The cut moves with the epoch: not the same 4 samples left out of every epoch.
    assert len(set(left_out)) > 1, left_out
    loader.shutdown()


def test_pad_last_batch_marks_padding(ray_session, dataset):
    loader = make_loader(dataset, pad_last_batch=True, batch_size=8)
    iterators = [
        loader.iterator(world_rank=r, world_size=3, batch_format="numpy") for r in range(3)
    ]
    batches = run_lockstep(iterators)
    assert all(len(b["id"]) == 8 for rank in batches for b in rank)
    ids = [i for rank in batches for i in real_ids(rank)]
    assert Counter(ids) == Counter(range(100))
    padded = sum(int(b["_padded"].sum()) for rank in batches for b in rank)
    assert padded == 3 * 40 - 100  # every shard padded to 40 (34 rounded up to 8s)
    loader.shutdown()


def test_same_seed_same_order_per_rank_whatever_the_reader_threads(ray_session, dataset):
    def orders(seed, threads):
        loader = make_loader(dataset, shuffle=True, seed=seed, reader_threads=threads)
        its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
        out = [real_ids(b) for b in run_lockstep(its)]
        loader.shutdown()
        return out

    # The same seed on another loader gives the same order, also when 3 threads read
    # pieces ahead (the order stays the plan's); another seed another order.
    first, again, other = orders(3, 1), orders(3, 3), orders(4, 1)
    assert first == again
    assert first != other
    assert sorted(first[0] + first[1]) == list(range(100))
    assert sorted(again[0] + again[1]) == list(range(100))


def test_rotation_follows_plan_cli(ray_session, dataset):
    loader = make_loader(dataset, rotation="shift", batch_size=5)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    result = CliRunner().invoke(
        cli,
        [
            "plan",
            "--samples",
            "100",
            "--world-size",
            "2",
            "--rotation",
            "shift",
            "--batch-size",
            "5",
            "--epochs",
            "3",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    expected = json.loads(result.output)["epochs"]
    for epoch in range(3):
        batches = run_lockstep(its)
        for rank, rank_batches in enumerate(batches):
            plan = expected[epoch]["ranks"][rank]
            want = [i for a, b in plan["ranges"] for i in range(a, b)]
            assert real_ids(rank_batches) == want, f"epoch {epoch} rank {rank}"
            assert len(rank_batches) == plan["batches"]
    loader.shutdown()


def test_a_state_of_a_job_that_set_expected_world_size_resumes_on_another(ray_session, dataset):
    """`expected_world_size` checks the running job: a state saved by 2 ranks with it set
    to 2 resumes on 1 rank with it set to 1 (it was in the loader's id, so refused, and the
    rest of the epoch was planned against the new value)."""
    ids = {LoaderConfig(expected_world_size=n).fingerprint("s", 100) for n in (None, 1, 2)}
    assert len(ids) == 1  # not in the id (nor, so, in the ids of loaders without it)
    loader = make_loader(dataset, shuffle=True, seed=1, expected_world_size=2)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    received = [i for rank in run_lockstep(its, steps=2) for i in real_ids(rank)]
    state = its[0].state_dict()
    loader.shutdown()
    fresh = make_loader(dataset, shuffle=True, seed=1, expected_world_size=1)
    state["loader"] = fresh.loader_id  # (this test's loaders differ by name alone)
    it = fresh.iterator(world_rank=0, world_size=1, batch_format="numpy")
    it.load_state_dict(state)
    assert Counter(received + real_ids(list(it))) == Counter(range(100))
    fresh.shutdown()


def test_expected_world_size_counts_data_parallel_ranks_of_dp_groups(ray_session, dataset):
    """`dp_groups` given alone (groups of 2): `expected_world_size=2` data-parallel ranks
    is a world of 4 (it was checked as a world of 2, refused whatever the value)."""
    groups = [[0, 1], [2, 3]]
    loader = make_loader(dataset, dp_groups=groups, expected_world_size=2)
    assert loader.settings.runtime.group_size == 2
    loader.shutdown()
    with pytest.raises(ConfigError, match=r"do not partition range\(world_size=6\)"):
        make_loader(dataset, dp_groups=groups, expected_world_size=3)


def test_resume_mid_epoch_nothing_missing_nothing_repeated(ray_session, dataset):
    loader = make_loader(dataset, shuffle=True, seed=1)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    before = run_lockstep(its, steps=3)
    state = json.loads(json.dumps(its[1].state_dict()))  # JSON-safe
    assert state["epoch"] == 0
    # Prefetched batches are not in the state: exactly the received ones are.
    received = sorted(i for rank in before for i in real_ids(rank))
    assert [i for a, b in state["consumed"] for i in range(a, b)] == received
    loader.shutdown()

    fresh = make_loader(dataset, shuffle=True, seed=1)
    state["loader"] = fresh.loader_id  # same configuration, new name in this test
    # The same world size, then more and fewer ranks: each restores the state again (a
    # new membership, as a restarted group's) on the same fresh loader.
    for new_world in [2, 3, 1]:
        resumed = [
            fresh.iterator(world_rank=r, world_size=new_world, batch_format="numpy")
            for r in range(new_world)
        ]
        for it in resumed:
            it.load_state_dict(state)
        assert [it.epoch for it in resumed] == [0] * new_world
        lengths = [len(it) for it in resumed]
        after = run_lockstep(resumed)
        assert [len(b) for b in after] == lengths, new_world
        rest = [i for rank in after for i in real_ids(rank)]
        assert Counter(received + rest) == Counter(range(100)), new_world
        # The epoch after the resumed one is whole again.
        nxt = run_lockstep(resumed)
        assert Counter(i for rank in nxt for i in real_ids(rank)) == Counter(range(100))
    fresh.shutdown()


def test_same_name_other_namespace_is_another_loader_whose_state_is_refused(ray_session, dataset):
    name = unique_name("ns")
    a = Loader(ParquetSource(dataset), batch_size=10, name=name, namespace="job-a")
    b = Loader(ParquetSource(dataset), batch_size=25, name=name, namespace="job-b")
    ita = a.iterator(world_rank=0, world_size=1, batch_format="numpy")
    itb = b.iterator(world_rank=0, world_size=1, batch_format="numpy")
    assert (len(ita), len(itb)) == (10, 4)
    with pytest.raises(ConfigError, match="already exists in namespace 'job-a'"):
        Loader(ParquetSource(dataset), batch_size=10, name=name, namespace="job-a")
    # A state of one loader is refused by another (same name, another configuration)
    state = ita.state_dict()
    with pytest.raises(ConfigError, match="belongs to loader") as refused:
        b.iterator(world_rank=0, world_size=1).load_state_dict(state)
    # its own error, naming what differs, not Ray's wrapper with a remote traceback
    assert type(refused.value) is ConfigError
    message = str(refused.value)
    assert message.startswith("loader ") and "load_state_dict" in message
    assert "batch_size: 10 in the state, 25 here" in message and "Traceback" not in message
    assert state["made_by"]["batch_size"] == 10
    a.shutdown()
    b.shutdown()


def test_restarted_group_restoring_while_a_worker_registers(ray_session, dataset):
    # A restarted Ray Train group: worker 1 registered, then worker 0 restored the
    # checkpoint (a new generation) before worker 1 attached its reader. Worker 1 must
    # still get its reader, and its own restore moves it to the new generation.
    import ray

    from rayshard.plan import data_parallel_rank

    loader = make_loader(dataset)
    first = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    received = [i for rank in run_lockstep(first, steps=2) for i in real_ids(rank)]
    state = first[0].state_dict()
    dp = data_parallel_rank(1, 2, 1, None)
    registration = ray.get(
        loader._coordinator.register.remote(1, 2, {"dp_rank": 1, "dp_size": 2, "group": [1]})
    )
    worker0 = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
    worker0.load_state_dict(state)  # the generation moves on
    # worker 1 attaches the reader named at registration
    loader._reader(registration, dp, loader._rank_reading(1), watch_only=False)
    worker1 = loader.iterator(world_rank=1, world_size=2, batch_format="numpy")
    worker1.load_state_dict(state)
    rest = [i for rank in run_lockstep([worker0, worker1]) for i in real_ids(rank)]
    assert Counter(received + rest) == Counter(range(100))
    loader.shutdown()


def reader_gone(iterator) -> bool:
    """True once the rank's reader actor is dead (its `watch()` raises)."""
    import ray

    try:
        ray.get(iterator._holds.reader.watch.remote(), timeout=EVENT_TIMEOUT_S)
    except ray.exceptions.RayActorError:
        return True
    return False


@pytest.mark.parametrize("consumer_reads", [False, True])
def test_shutdown_stops_the_readers_too(ray_session, dataset, consumer_reads, monkeypatch):
    import ray

    from rayshard.runtime import pid_watch

    # Consumer reads: the ranks watched by this process's `RankWatch` (as on another node
    # than the coordinator's), whose keys a shutdown releases; a pid watch ends with the
    # coordinator.
    monkeypatch.setenv(pid_watch.ENABLE_VARIABLE, "0")
    loader = make_loader(dataset, consumer_reads=consumer_reads)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    run_lockstep(its, steps=1)
    threads = [it._acks._thread for it in its]  # their acknowledgement threads
    assert all(thread.is_alive() for thread in threads)
    watches = [watch_of(it) if consumer_reads else it._holds.reader for it in its]  # handles kept
    loader.shutdown()  # the iterators (and so the readers' handles) are still alive here
    # It closed this process's iterators first (joining their threads, which would
    # otherwise wake every `ack_interval_s` for the life of the process).
    assert not any(thread.is_alive() for thread in threads)
    for it, watch in zip(its, watches):
        if consumer_reads:  # the ranks' keys in this process's watch are released
            # a watch of a held key blocks; of a released one returns
            ray.get(watch.watch.remote(it._holds.watch_key), timeout=EVENT_TIMEOUT_S)
            assert it._holds.watch_key not in ray.get(watch.keys.remote())
            continue
        # Shutdown stops a rank's reader (its watch then returns) and kills it (its watch
        # then raises): a watch sent in between returns, so look until the actor is gone.
        wait_until(lambda it=it: reader_gone(it), "a reader to end after Loader.shutdown()")
    for it in its:
        it.close()  # nothing left to leave: no error


@pytest.mark.parametrize(("options", "blocks"), [({}, [13]), ({"object_bytes": 1}, [1] * 13)])
def test_object_store_blocks_close_at_the_batch_count_or_the_byte_cap(
    ray_session, dataset, options, blocks
):
    # 100 rows in batches of 8: 13 batches, all in one block of up to 16 by default; a
    # 1-byte cap closes a block after every batch. Read straight from the reader actor.
    import ray

    loader = make_loader(dataset, consumer_reads=False, **options)
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    reader, generation = it._holds.reader, it._generation
    ray.get(reader.start.remote(generation, 0))
    sizes, ids, runs = [], [], []
    while (ref := ray.get(reader.next.remote(generation, 0, len(sizes)))) is not None:
        block = ray.get(ref)  # a `Block`: its place in the stream, tagged batches, runs
        assert (block.generation, block.epoch, block.index) == (generation, 0, len(sizes))
        sizes.append(len(block.batches))
        batches = [batch for _, batch in block.batches]
        ids += real_ids(batches)
        assert sum(meta.real for meta, _ in block.batches) == len(real_ids(batches))
        runs += block.runs
    assert sizes == blocks
    assert Counter(ids) == Counter(range(100))
    # the blocks' sample-id runs (dataset indices, here equal to `id`) cover it once
    assert iv.normalize(runs) == ((0, 100),) and iv.total(runs) == 100
    loader.shutdown()


def test_object_bytes_bounds_a_block_of_large_binary_values(ray_session, tmp_path):
    # 100 rows of 10 KB images in batches of 8 (80 KB a batch) under a 100 KB cap: a block
    # closes at its second batch. The reader ships the column as Arrow, whose values count
    # in full (a consumer's object array of them counts 8 bytes a row: 13 batches, 1 block).
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    images = [bytes([i]) * 10_000 for i in range(100)]
    pq.write_table(pa.table({"id": range(100), "image": images}), tmp_path / "images.parquet")
    loader = Loader(
        ParquetSource(str(tmp_path)),
        batch_size=8,
        name=unique_name("img-blocks"),
        consumer_reads=False,
        object_bytes=100_000,
    )
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    reader, generation = it._holds.reader, it._generation
    ray.get(reader.start.remote(generation, 0))
    sizes, got = [], []
    while (ref := ray.get(reader.next.remote(generation, 0, len(sizes)))) is not None:
        block = ray.get(ref)
        sizes.append(len(block.batches))
        got += [bytes(v) for _, batch in block.batches for v in batch["image"].to_pylist()]
    assert sizes == [2] * 6 + [1]
    assert got == images
    loader.shutdown()


# (3, 1, 3) is not run: its reader keeps 3 blocks ready as (5, 2, 3)'s does, and the
# rule ceil(depth / per_block) is checked with one batch a block by (1, 1, 1) and rounding
# up by (5, 2, 3).
@pytest.mark.parametrize(("depth", "per_block", "ahead"), [(1, 1, 1), (5, 2, 3)])
def test_a_reader_keeps_the_read_ahead_budget_ready_in_whole_blocks(
    ray_session, dataset, depth, per_block, ahead
):
    # `prefetch_depth` batches in blocks of `batches_per_object`: the reader keeps
    # ceil(depth / per_block) blocks ready, and one more once its consumer took one.
    import time

    import ray

    loader = make_loader(
        dataset, consumer_reads=False, prefetch_depth=depth, batches_per_object=per_block
    )
    assert loader.settings.blocks_ahead == ahead
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    reader, generation = it._holds.reader, it._generation
    ray.get(reader.start.remote(generation, 0))

    def ready() -> list[int]:
        return sorted(ray.get(reader.__ray_call__.remote(lambda self: list(self._ready))))

    for taken in range(3):
        wait_until(lambda: len(ready()) >= ahead, "the reader to fill its read-ahead")
        time.sleep(0.3)  # a reader without the bound would read on meanwhile
        assert ready() == list(range(taken, taken + ahead))
        assert ray.get(reader.next.remote(generation, 0, taken)) is not None
    loader.shutdown()


def test_bad_iterator_arguments_are_refused_before_the_rank_registers(ray_session, dataset):
    """Each is refused before any remote call: no rank joined, no reader started (a bool
    rank was rank 1, a bad device failed only at the first batch)."""
    loader = make_loader(dataset)
    # (and a loader without a configuration file takes the defaults: seed 0, equal steps)
    assert loader.settings.plan.seed == 0 and loader.settings.plan.equal_steps is True
    for args, error, message in [
        ({"world_rank": True, "world_size": 2}, ConfigError, "world_rank=True must be an int"),
        ({"world_rank": 0.5}, ConfigError, "world_rank=0.5 must be an integer"),
        ({"world_size": "1"}, ConfigError, "world_size='1' must be an integer"),
        ({"device": "bogus"}, ConfigError, "device='bogus' is not a torch device"),
        ({"batch_format": "pandas"}, ConfigError, "batch_format='pandas' is not a valid"),
        ({"batch_format": "numpy", "collate_fn": "x"}, TypeError, "collate_fn='x' is not"),
    ]:
        with pytest.raises(error, match=re.escape(message)):
            loader.iterator(**{"world_rank": 0, "world_size": 1, **args})
    stats = loader.stats()
    assert (stats["ranks"], stats["readers"]) == ([], 0)
    batches = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    assert loader.stats()["ranks"] == [0] and len(batches) == 13
    loader.shutdown()


def test_ranks_that_come_back_without_a_checkpoint_go_on_with_their_epoch(ray_session, dataset):
    """A Train group restarted before any checkpoint held the loader's state: its new
    iterators start with the epoch their ranks are in (epoch 1 here, two steps in), not at
    epoch 0, which the loader would refuse as stale. Without a state to resume from, the
    epoch is read whole again (the model restarted without one too). Then a new membership
    makes those iterators stale."""
    loader = make_loader(dataset)
    first = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in (0, 1)]
    epoch0 = run_lockstep(first)
    part = run_lockstep(first, steps=2)  # into epoch 1, then the group goes away
    assert [it.epoch for it in first] == [1, 1]
    again = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in (0, 1)]
    assert [it.epoch for it in again] == [1, 1]
    rest = run_lockstep(again)
    epoch2 = run_lockstep(again)
    ids = [[i for rank in batches for i in real_ids(rank)] for batches in (epoch0, epoch2)]
    assert Counter(ids[0]) == Counter(ids[1]) == Counter(range(100))
    assert len(part[0]) == 2
    assert Counter(i for rank in rest for i in real_ids(rank)) == Counter(range(100))
    # An iterator of an older membership is refused once a new one registered.
    loader.iterator(world_rank=0, world_size=3, batch_format="numpy")  # new membership
    with pytest.raises(StaleClientError, match="generation"):
        list(again[0])
    loader.shutdown()


def test_an_iterator_made_per_epoch_reads_epoch_after_epoch(ray_session, dataset):
    """A loop that makes a new iterator every epoch (closing the last one or not) gets the
    next epoch each time, in that epoch's shuffle order, not epoch 0 again."""
    loader = make_loader(dataset, shuffle=True, seed=4)
    orders = []
    for epoch in range(3):
        it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        assert it.epoch == epoch
        ids = real_ids(list(it))
        assert Counter(ids) == Counter(range(100))
        orders.append(ids)
        if epoch == 1:
            it.close()
    assert orders[0] != orders[1] != orders[2]
    # on another world size too: the next epoch, whole, not an empty rest of the last one
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in (0, 1)]
    assert [it.epoch for it in its] == [3, 3]
    batches = run_lockstep(its)
    assert Counter(i for rank in batches for i in real_ids(rank)) == Counter(range(100))
    loader.shutdown()


def test_replicate_ranks_read_every_file_each_in_its_own_order(ray_session, tmp_path):
    """`uneven="replicate"`: every rank reads every file, in the seeded order the plan
    gives it (they read in dataset order before, so DDP ranks saw identical batches)."""
    from rayshard.plan import DataLayout, plan_epoch

    data = write_parquet(tmp_path / "files", [4] * 5, row_group_size=4)
    loader = make_loader(data, batch_size=4, policy="file", uneven="replicate", seed=3)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in (0, 1)]
    read = [[i // 4 for i in real_ids(rank)] for rank in run_lockstep(its)]
    plan = plan_epoch(loader.settings.plan, DataLayout.of_files([4] * 5), 2, 0, by_files=True)
    orders = [list(r.file_order) for r in plan.ranks]
    assert orders[0] != orders[1]
    assert read == [[f for f in order for _ in range(4)] for order in orders]
    loader.shutdown()


def test_model_parallel_group_gets_identical_batches(ray_session, dataset):
    loader = make_loader(dataset, model_parallel_size=2)
    its = [loader.iterator(world_rank=r, world_size=4, batch_format="numpy") for r in range(4)]
    batches = run_lockstep(its)
    assert real_ids(batches[0]) == real_ids(batches[1])
    assert real_ids(batches[2]) == real_ids(batches[3])
    assert Counter(real_ids(batches[0]) + real_ids(batches[2])) == Counter(range(100))
    assert loader.stats()["readers"] == 2  # read once per group
    loader.shutdown()


def test_torch_format_and_iterating_again_advances_epoch(ray_session, dataset):
    import torch

    loader = make_loader(dataset, batch_size=16)
    it = loader.iterator(world_rank=0, world_size=1)
    first = list(it)
    assert it.epoch == 1 and len(it) == len(first) == 7
    assert isinstance(first[0]["x"], torch.Tensor) and first[0]["x"].shape == (16, 4)
    assert first[0]["x"].dtype == torch.float32
    second = list(it)
    assert sorted(int(i) for b in second for i in b["id"]) == list(range(100))
    loader.shutdown()


class FailsOnce:
    """A collate_fn that raises on its second batch (a transient error in the loop's process)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("transient")
        return batch


def _break_and_iterate_again(loader) -> None:
    """Epoch 0 on a fresh iterator: break after 3 batches, iterate again."""
    it = loader.iterator(world_rank=0, world_size=1)  # torch format: device feed on the CPU
    seen = []
    for step, batch in enumerate(it):
        seen += batch["id"].tolist()
        if step == 2:
            break
    # The feed has read ahead, but the state holds exactly the 3 batches received.
    state = it.state_dict()
    assert [i for a, b in state["consumed"] for i in range(a, b)] == sorted(seen)
    assert len(it) == 7 and it.stats()["feed"]["batches_delivered"] == 3
    for batch in it:
        seen += batch["id"].tolist()
    assert sorted(seen) == list(range(100))
    assert it.epoch == 1


def _error_then_iterate_again(loader, batch_format: str, epoch: int) -> None:
    """A new iterator at `epoch` whose collate_fn fails at its second batch."""
    it = loader.iterator(
        world_rank=0, world_size=1, batch_format=batch_format, collate_fn=FailsOnce()
    )
    assert it.epoch == epoch
    seen = []
    with pytest.raises(RuntimeError, match="transient"):
        for batch in it:
            seen += [int(i) for i in batch["id"]]
    assert len(seen) == 10
    # Iterating again must not end the epoch quietly with 90 samples never delivered.
    with pytest.raises(RayshardError, match=rf"epoch {epoch} stopped after 1 of 10 batches"):
        list(it)
    assert it.epoch == epoch and len(it) == 9
    state = it.state_dict()
    assert state["epoch"] == epoch and iv.total(state["consumed"]) == 10
    # The way on, as the error says: resume from the state, here on the same iterator.
    it.load_state_dict(state)
    rest = [int(i) for b in it for i in b["id"]]
    assert sorted(seen + rest) == list(range(100)) and it.epoch == epoch + 1


def test_break_or_an_error_then_iterating_again_continues_the_epoch(ray_session, dataset):
    """One loader, an epoch each (every time a new iterator for the rank): a break, then
    an error in the loop's collate_fn with numpy and with torch batches (the device feed,
    which reads 3 batches ahead here)."""
    loader = make_loader(dataset, batch_size=10, prefetch_depth=3)
    _break_and_iterate_again(loader)
    _error_then_iterate_again(loader, "numpy", epoch=1)
    _error_then_iterate_again(loader, "torch", epoch=2)
    loader.shutdown()


def test_off_policy_every_rank_reads_everything_in_own_order(ray_session, dataset):
    loader = make_loader(dataset, policy="off", batch_size=10)
    for world_size in [2, 3]:  # one loader: 3 ranks at the next epoch
        its = [
            loader.iterator(world_rank=r, world_size=world_size, batch_format="numpy")
            for r in range(world_size)
        ]
        orders = [real_ids(b) for b in run_lockstep(its)]
        assert all(sorted(order) == list(range(100)) for order in orders)
        assert len({tuple(order) for order in orders}) == world_size  # own seeded order each
    loader.shutdown()


def test_shuffle_buffer_mixes_rows_and_keeps_coverage(ray_session, dataset):
    loader = make_loader(dataset, shuffle_buffer=40, seed=5, batch_size=10)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    orders = [real_ids(b) for b in run_lockstep(its)]
    assert sorted(orders[0] + orders[1]) == list(range(100))
    assert orders[0] != sorted(orders[0])  # rows, not just splits, were shuffled
    loader.shutdown()


def test_loader_from_yaml_explicit_wins(ray_session, dataset, tmp_path):
    config = tmp_path / "loader.yaml"
    config.write_text(
        f"paths: [{dataset}]\nbatch_size: 50\npolicy: file\nuneven: replicate\nseed: 3\n"
    )
    loader = Loader.from_yaml(
        str(config), batch_size=25, loader_options={"name": unique_name("yaml")}
    )
    it = loader.iterator(world_rank=0, world_size=2, batch_format="numpy")
    assert len(it) == 4  # replicate: every rank reads all 100 rows, in batches of 25
    loader.shutdown()


def test_configuration_file_values_are_not_overridden_by_defaults(ray_session, dataset):
    """`seed` and `equal_steps` left unset take the configuration file's values (the
    constructor's defaults used to count as explicit and silently won); explicit wins."""
    from_file = make_loader(dataset, config_file={"seed": 5, "equal_steps": False})
    assert from_file.settings.plan.seed == 5 and from_file.settings.plan.equal_steps is False
    from_file.shutdown()
    explicit = make_loader(dataset, seed=3, equal_steps=True, config_file={"seed": 5})
    assert explicit.settings.plan.seed == 3 and explicit.settings.plan.equal_steps is True
    explicit.shutdown()
    # without a file, the defaults: test_bad_iterator_arguments_are_refused_before_...


def test_the_restart_check_keeps_rays_deprecation_warning_out_of_the_log(ray_session):
    import ray

    from tests.runtime.helpers import RestartCheck

    actor = ray.remote(num_cpus=0)(RestartCheck).remote()
    restarted, ours, rays = ray.get(actor.check.remote())
    ray.kill(actor)
    if not rays:
        pytest.skip("this Ray's restart property raises no warning: nothing to keep out")
    assert not restarted  # a first start
    assert ours == [], ours  # Ray's property warns (`rays`); the coordinator's check does not


def test_a_bad_state_is_refused_and_leaves_the_loader_working(ray_session, dataset):
    loader = make_loader(dataset, batch_size=10)
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    gen = iter(it)
    taken = [int(i) for _ in range(3) for i in next(gen)["id"]]
    state = it.state_dict()
    for edit in ({"epoch": -1}, {"consumed": [[30, 0]]}, {"num_samples": 50}):
        with pytest.raises(ConfigError, match="malformed loader state|counts 50 samples"):
            it.load_state_dict({**state, **edit})
    it.load_state_dict(state)  # the loader took none of them: the good state still resumes
    rest = [int(i) for b in it for i in b["id"]]
    assert sorted(taken + rest) == list(range(100))
    loader.shutdown()


@pytest.mark.parametrize("given", [{"world_size": 4}, {"world_rank": 2}])
def test_outside_ray_train_an_iterator_needs_both_rank_and_size_or_neither(
    ray_session, tmp_path, given
):
    """Only `world_size` given outside Ray Train made every worker rank 0 (each replacing
    the last); only `world_rank`, a range error about a world of 1."""
    loader = Loader(ParquetSource(write_parquet(tmp_path, [8])), batch_size=4)
    with pytest.raises(ConfigError, match="give both"):
        loader.iterator(**given)
    loader.shutdown()


@pytest.mark.timeout(180)
def test_a_group_member_that_starts_late_is_served_beside_the_others_waiting_calls(
    ray_session, dataset
):
    """The members of a model-parallel group share one reader actor; each keeps block
    calls in flight, and a call for a block not read yet holds one of the actor's threads
    (the reader reads ahead of the slowest member only). Two members waiting so filled a
    pool sized by the group alone, and the third member's calls never ran: all hung."""
    import threading

    loader = make_loader(dataset, model_parallel_size=3, prefetch_depth=2, batches_per_object=1)
    its = [loader.iterator(world_rank=r, world_size=3, batch_format="numpy") for r in range(3)]
    read: dict[int, list] = {}
    early = [threading.Thread(target=lambda r=r: read.update({r: list(its[r])})) for r in (0, 1)]
    for thread in early:
        thread.start()
    wait_until(lambda: all(it.stats()["batches_received"] >= 2 for it in its[:2]), "a head start")
    read[2] = list(its[2])  # the late member
    for thread in early:
        thread.join()
    assert real_ids(read[0]) == real_ids(read[1]) == real_ids(read[2])
    assert Counter(real_ids(read[2])) == Counter(range(100))
    loader.shutdown()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_a_group_member_closing_its_iterator_leaves_the_others_reading(
    ray_session, dataset, policy
):
    """One member's `close()` mid-epoch leaves the rank and the reader the group shares to
    the others: they read the rest of the epoch and the next (the blocks the closed one
    did not take are not kept for it, so the reader does not wait for it); the rank
    leaves with its last member. (The first `close()` stopped the shared reader: the
    others' reads failed; before that, they waited for ever.)"""
    loader = make_loader(
        dataset, model_parallel_size=2, prefetch_depth=1, batches_per_object=1, policy=policy
    )
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    first = [next(iter(it)) for it in its]
    assert real_ids([first[0]]) == real_ids([first[1]])
    its[0].close()
    assert loader.stats()["ranks"] == [0]  # still read by the other member
    rest = list(its[1])
    assert Counter(real_ids([first[1], *rest])) == Counter(range(100))
    assert Counter(real_ids(list(its[1]))) == Counter(range(100))  # the next epoch
    its[1].close()
    assert loader.stats()["ranks"] == []
    loader.shutdown()


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_a_group_member_closing_at_the_epochs_end_leaves_the_others_their_rest(
    ray_session, dataset, policy
):
    """The end of training: the member that finishes first closes (stopping the reader
    the group shares); the others still get the rest of the epoch read already, and its
    end, not an error."""
    loader = make_loader(
        dataset, model_parallel_size=2, prefetch_depth=1, batches_per_object=1, policy=policy
    )
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    streams = [iter(it) for it in its]
    steps = len(its[0])
    first: list = []
    for _ in range(steps - 1):  # in step, member 1 one batch behind at the end
        first.append(next(streams[0]))
        next(streams[1])
    first.append(next(streams[0]))
    its[0].close()
    rest = list(streams[1])
    assert len(rest) == 1 and real_ids(rest) == real_ids(first[-1:])
    loader.shutdown()


def test_a_group_whose_shared_reader_died_gets_a_rayshard_error_naming_it(ray_session, dataset):
    """The group's reader gone (its process, the process that made it, or their node
    ended): each member's next batch raises a `RayshardError` saying so and what to do,
    not Ray's error naming an object id."""
    import ray

    loader = make_loader(dataset, model_parallel_size=2, prefetch_depth=1, batches_per_object=1)
    its = [loader.iterator(world_rank=r, world_size=2, batch_format="numpy") for r in range(2)]
    streams = [iter(it) for it in its]
    for stream in streams:
        next(stream)
    ray.kill(its[0]._holds.reader, no_restart=True)
    for stream in streams:
        with pytest.raises(RayshardError, match="its reader is gone.*take a new iterator"):
            for _ in range(len(its[0]) + 1):
                next(stream)
    loader.shutdown()
