"""Transforms on a real local Ray over real Parquet: where they run, per-sample random state
across world sizes, policies, batching and a resume; filters' exactly-once accounting;
errors in the training loop; transforms refused at construction."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from rayshard.data.transforms import sample_rng
from rayshard.errors import TransformError
from rayshard.loader import Loader
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import run_lockstep, unique_name
from tests.runtime.transform_fns import drop_below_16, drop_thirds, exit_at_42, noisy, slow_noisy
from tests.timeouts import wait_until

pytestmark = pytest.mark.ray

SIZES = [23, 17, 31, 9, 20]  # 100 rows, uneven files, row groups of 7
N = sum(SIZES)
KEPT = [i for i in range(N) if i % 3 != 0]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("transform")
    start = 0
    for number, rows in enumerate(SIZES):
        ids = np.arange(start, start + rows, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "text": [f"sample-{i}" for i in ids],
                "blob": [bytes([i % 256]) * (i % 5) for i in ids],
            }
        )
        pq.write_table(table, os.path.join(folder, f"part-{number}.parquet"), row_group_size=7)
        start += rows
    return str(folder)


def make_loader(dataset, **options):
    options.setdefault("batch_size", 8)
    return Loader(ParquetSource(dataset), name=unique_name("tf"), **options)


def noise_by_sample(rank_batches) -> dict[int, float]:
    """Sample index -> noise of the real rows; fails on a sample delivered twice."""
    out: dict[int, float] = {}
    for batches in rank_batches:
        for batch in batches:
            for index, value in zip(batch["_index"][~batch["_padded"]], batch["noise"]):
                assert int(index) not in out, f"sample {index} delivered twice"
                out[int(index)] = float(value)
    return out


def iterators(loader, world, fmt="numpy"):
    return [loader.iterator(world_rank=r, world_size=world, batch_format=fmt) for r in range(world)]


@pytest.fixture(scope="module")
def reference(ray_session, dataset):
    """One rank's epoch of `noisy` (seed 11) and the pid of the reader that ran it."""
    loader = make_loader(dataset, transform=noisy, seed=11)
    (it,) = iterators(loader, 1)
    batches = list(it)
    (name,) = ray.get(loader._coordinator.reader_names.remote())
    reader = ray.get_actor(name, namespace=loader.namespace)
    reader_pid = ray.get(reader.__ray_call__.remote(lambda self: os.getpid()))
    loader.shutdown()
    return batches, reader_pid


@pytest.fixture(scope="module")
def reference_noise(reference):
    return noise_by_sample([reference[0]])


def test_transform_runs_in_the_reader_process_on_lists_for_strings(reference):
    batches, reader_pid = reference
    pids = {int(p) for b in batches for p in b["pid"]}
    assert pids == {reader_pid} and reader_pid != os.getpid()
    assert all(b["text_ok"].all() for b in batches)
    assert [int(n) for b in batches for n in b["blob_len"]] == [i % 5 for i in range(N)]


def test_reference_noise_is_the_samples_own_random_state(reference_noise):
    assert sorted(reference_noise) == list(range(N))
    assert reference_noise == {i: sample_rng(11, 0, i).random() for i in range(N)}


@pytest.mark.parametrize(
    ("world", "options"),
    [
        # The transform sees the batches the policy made, whatever it is (`reader_batches`):
        # a policy's pieces, batch sizes, split rows and world sizes are what differ here.
        # Transform workers: `test_transform_workers_keep_the_order_and_survive_a_worker_death`.
        (3, {"policy": "data", "shuffle": True, "batch_size": 5}),
        (2, {"policy": "file"}),
        (2, {"policy": "dynamic", "split_rows": 10, "batch_size": 4}),
    ],
)
def test_same_noise_per_sample_whatever_world_policy_and_batching(
    ray_session, dataset, reference_noise, world, options
):
    split_rows = options.pop("split_rows", None)
    loader = Loader(
        ParquetSource(dataset, split_rows=split_rows),
        name=unique_name("tf"),
        transform=noisy,
        seed=11,
        **{"batch_size": 8, **options},
    )
    its = iterators(loader, world)
    epoch0 = noise_by_sample(run_lockstep(its))
    assert epoch0 == reference_noise
    epoch1 = noise_by_sample(run_lockstep(its))  # the next epoch draws anew
    assert epoch1 == {i: sample_rng(11, 1, i).random() for i in range(N)}
    loader.shutdown()


@pytest.mark.parametrize(
    ("policy", "world", "new_world"), [("data", 1, 2), ("dynamic", 2, 1)]
)  # one grows, one shrinks
def test_same_noise_per_sample_across_a_resume_on_another_world_size(
    ray_session, dataset, reference_noise, policy, world, new_world
):
    loader = make_loader(dataset, transform=noisy, seed=11, policy=policy, shuffle=True)
    its = iterators(loader, world)
    before = run_lockstep(its, steps=3)
    state = json.loads(json.dumps(its[0].state_dict()))
    loader.shutdown()
    fresh = make_loader(dataset, transform=noisy, seed=11, policy=policy, shuffle=True)
    state["loader"] = fresh.loader_id  # same configuration, new name in this test
    resumed = iterators(fresh, new_world)
    for it in resumed:
        it.load_state_dict(state)
    after = run_lockstep(resumed)
    assert noise_by_sample([*before, *after]) == reference_noise
    fresh.shutdown()


@pytest.mark.parametrize("policy", ["data", "dynamic"])
def test_filter_covers_the_kept_samples_exactly_once_and_keeps_steps(ray_session, dataset, policy):
    name = unique_name("tf")  # the same name in two namespaces: the same configuration
    options = {"batch_size": 8, "name": name, "policy": policy}
    loader = Loader(ParquetSource(dataset), namespace=f"{name}-a", transform=drop_thirds, **options)
    plain = Loader(ParquetSource(dataset), namespace=f"{name}-b", **options)
    assert plain.loader_id == loader.loader_id  # the transform is not part of the loader id
    its, reference = iterators(loader, 2), iterators(plain, 2)
    for epoch in range(2):
        lengths = [len(it) for it in its]
        assert lengths == [len(it) for it in reference]  # a filter leaves step counts alone
        batches = run_lockstep(its)
        assert [len(b) for b in batches] == lengths
        ids = [int(i) for rank in batches for b in rank for i in b["id"][~b["_padded"]]]
        assert Counter(ids) == Counter(KEPT), f"epoch {epoch}"
        assert all(len(b["id"]) <= 8 for rank in batches for b in rank)
        state = its[0].state_dict()  # the epoch is complete: dropped samples were consumed
        assert state["epoch"] == epoch + 1 and state["consumed"] == []
        run_lockstep(reference)
    stats = loader.stats()
    assert stats["reserved_samples"] == 0
    assert not any(e["event"] == "rank_lost" and e["reason"] != "left" for e in stats["events"])
    loader.shutdown()
    plain.shutdown()


def test_filter_can_empty_a_batch_which_still_counts_as_a_step(ray_session, dataset):
    loader = make_loader(dataset, transform=drop_below_16)
    (it,) = iterators(loader, 1, "torch")
    steps = len(it)
    batches = list(it)
    assert len(batches) == steps == -(-N // 8)
    assert [len(b["id"]) for b in batches[:3]] == [0, 0, 8]
    assert [int(i) for b in batches for i in b["id"]] == list(range(16, N))
    assert it.state_dict()["epoch"] == 1  # the emptied batches' samples were consumed too
    loader.shutdown()


def test_filter_resume_counts_dropped_samples_consumed(ray_session, dataset):
    loader = make_loader(dataset, transform=drop_thirds)
    its = iterators(loader, 2)
    before = run_lockstep(its, steps=2)
    state = json.loads(json.dumps(its[1].state_dict()))
    # Ranks read [0, 50) and [50, 100) in order: their first two batches of 8 rows are
    # consumed, including the samples the filter dropped from them.
    assert state["consumed"] == [[0, 16], [50, 66]]
    loader.shutdown()
    fresh = make_loader(dataset, transform=drop_thirds)
    state["loader"] = fresh.loader_id  # same configuration, new name in this test
    resumed = iterators(fresh, 1)  # another world: the rest of both ranks' ranges on one
    for it in resumed:
        it.load_state_dict(state)
    after = run_lockstep(resumed)
    ids = [int(i) for part in (before, after) for rank in part for b in rank for i in b["id"]]
    assert Counter(ids) == Counter(KEPT)
    assert resumed[0].state_dict()["epoch"] == 1
    nxt = run_lockstep(resumed)
    assert Counter(int(i) for rank in nxt for b in rank for i in b["id"]) == Counter(KEPT)
    fresh.shutdown()


# Each format and each place the transform runs once: the error reaches the consumer's
# blocks the same way from a reader and from its workers, before any format conversion.
@pytest.mark.parametrize(("fmt", "workers"), [("torch", 1), ("numpy", 2)])
def test_transform_error_reaches_the_loop_as_transform_error(
    ray_session, dataset, fmt, workers, monkeypatch
):
    import gc

    import ray._private.worker

    unhandled: list[str] = []  # what Ray would log as "Unhandled error" once refs are freed
    monkeypatch.setattr(ray._private.worker, "_unhandled_error_handler", unhandled.append)

    def explode_at_42(batch, ctx):
        if 42 in ctx.indices:
            raise ValueError("sample 42 is cursed")
        return {"id": batch["id"]}

    loader = make_loader(dataset, transform=explode_at_42, transform_workers=workers)
    its = iterators(loader, 1, fmt)  # rows 40..47 are the sixth batch of rank 0 in any world
    received = []
    with pytest.raises(TransformError) as info:
        for batch in its[0]:
            received.append(batch)
    text = str(info.value)
    assert f"loader {loader.loader_id!r}" in text and "rank 0" in text and "epoch 0" in text
    assert "[40, 47]" in text  # the batch of rows 40..47
    assert "ValueError('sample 42 is cursed')" in text and "in explode_at_42" in text
    assert len(received) == 5  # the batches before the failing one were delivered
    assert (info.value.rank, info.value.epoch, info.value.samples) == (0, 0, (40, 48))
    del its, info  # the requests the iterator had in flight are freed: all were answered
    gc.collect()
    ray.get(ray.put(0))
    assert unhandled == []
    loader.shutdown()


def test_a_transform_that_exits_is_a_transform_error_in_worker_processes(ray_session, dataset):
    """In transform workers a `SystemExit` ended the worker process, which Ray restarted
    and retried the call on, forever: the loop hung. It is a `TransformError` now."""
    import threading

    from tests.timeouts import EVENT_TIMEOUT_S, event_timeout_message

    loader = make_loader(dataset, transform=exit_at_42, transform_workers=2)
    its = iterators(loader, 1)
    outcome: list = []

    def consume() -> None:
        try:
            outcome.append(sum(1 for _ in its[0]))
        except Exception as error:  # noqa: BLE001 - asserted below
            outcome.append(error)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        thread.join(EVENT_TIMEOUT_S)
        assert outcome, event_timeout_message("the transform's exit to reach the loop")
        assert isinstance(outcome[0], TransformError), outcome
        assert "SystemExit(3)" in str(outcome[0])
    finally:
        loader.shutdown()


def test_bad_transforms_are_refused_at_construction(ray_session, dataset):
    with pytest.raises(TypeError, match="is not callable"):
        make_loader(dataset, transform="tokenize")
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot be pickled"):
        make_loader(dataset, transform=lambda batch, ctx: batch if lock else None)


def worker_pids(loader) -> list[int]:
    """The pids of the transform workers of every reader of `loader`."""
    pids = []
    for name in ray.get(loader._coordinator.reader_names.remote()):
        reader = ray.get_actor(name, namespace=loader.namespace)
        handles = ray.get(reader.__ray_call__.remote(lambda self: self._workers or []))
        pids += ray.get([w.__ray_call__.remote(lambda self: os.getpid()) for w in handles])
    return pids


def batches_as_tuples(rank_batches):
    return [
        [(b["_index"].tolist(), b["_padded"].tolist(), b["noise"].tolist()) for b in batches]
        for batches in rank_batches
    ]


def test_transform_workers_keep_the_order_and_survive_a_worker_death(
    ray_session, dataset, reference_noise
):
    options = {"transform": slow_noisy, "seed": 11, "batch_size": 4, "shuffle": True}
    # The batches of one process running the transform (the consumer here: it gives a
    # reader's batches, `test_consumer_reads`), as the reference for the workers'.
    single = make_loader(dataset, consumer_reads=True, **options)
    expected = batches_as_tuples(run_lockstep(iterators(single, 1)))
    single.shutdown()

    loader = make_loader(dataset, transform_workers=2, batches_per_object=1, **options)
    its = iterators(loader, 1)  # one rank: 25 batches, most still ahead at the kill
    first = run_lockstep(its, steps=2)
    pids = worker_pids(loader)
    assert len(set(pids)) == 2  # 2 workers, each its own process
    os.kill(pids[0], signal.SIGKILL)  # a real process death mid-epoch
    rest = run_lockstep(its)
    got = batches_as_tuples([a + b for a, b in zip(first, rest)])
    assert got == expected  # same batches, same order, same random state
    assert noise_by_sample([a + b for a, b in zip(first, rest)]) == reference_noise
    seen = {int(p) for rank in rest for b in rank for p in b["pid"]}
    assert seen - set(pids), "a restarted worker process took over"
    names = ray.get(loader._coordinator.reader_names.remote())
    handles = [ray.get_actor(name, namespace=loader.namespace) for name in names]
    readers = ray.get([h.__ray_call__.remote(lambda self: os.getpid()) for h in handles])
    assert not seen & set(readers)  # the transform ran in the workers, not the readers
    assert loader.stats()["reserved_samples"] == 0
    epoch1 = noise_by_sample(run_lockstep(its))  # the workers draw the next epoch anew
    assert epoch1 == {i: sample_rng(11, 1, i).random() for i in range(N)}
    live = worker_pids(loader)
    loader.shutdown()
    wait_until(lambda: not any(alive(pid) for pid in live), "workers to die with their reader")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(("transform", "grouped"), [(noisy, True), (slow_noisy, False)])
def test_transform_workers_take_cheap_batches_in_groups_and_slow_ones_in_turns(
    ray_session, dataset, transform, grouped
):
    """A call per batch costs the reader more than a cheap transform: once the workers
    report a cheap one, a call carries consecutive batches (one worker transforms
    neighbours); a 30 ms transform goes one batch per call, alternating workers."""
    loader = make_loader(dataset, transform=transform, transform_workers=2, batch_size=4)
    (it,) = iterators(loader, 1)
    pids = [int(b["pid"][0]) for b in it]
    loader.shutdown()
    assert len(pids) == 25 and len(set(pids)) == 2  # 100 rows in batches of 4, 2 workers
    neighbours = [a == b for a, b in zip(pids, pids[1:])]
    assert any(neighbours) if grouped else not any(neighbours)


def test_transform_workers_need_a_transform(ray_session, dataset):
    with pytest.raises(ValueError, match="transform_workers=2 needs a transform"):
        make_loader(dataset, transform_workers=2)


def test_a_transform_sees_columns_under_the_loaders_padding_and_fill_rules(ray_session, tmp_path):
    from rayshard.data.columns import Padding
    from tests.runtime.transform_fns import identity

    tokens = pa.array([[7, 0, 3, 4, 5], [1], [2, 0], [3]], pa.list_(pa.int32()))
    table = pa.table({"tok": tokens, "x": pa.array([1.0, None, 3.0, 4.0])})
    pq.write_table(table, tmp_path / "part.parquet")
    rules = {"padding": {"tok": Padding(max_length=2, pad_value=-1)}, "fill_null": {"x": 0.0}}
    batches = {}
    for transform, workers in ((None, 1), (identity, 1), (identity, 2)):  # in the reader, workers
        loader = Loader(
            ParquetSource(str(tmp_path)),
            batch_size=4,
            name=unique_name(),
            transform=transform,
            transform_workers=workers,
            **rules,
        )
        (batch,) = list(loader.iterator(world_rank=0, world_size=1, batch_format="numpy"))
        batches[workers if transform else None] = {
            k: np.asarray(v).tolist() for k, v in batch.items()
        }
        loader.shutdown()
    assert batches[1] == batches[None] and batches[2] == batches[None]
    assert batches[None]["tok"] == [[7, 0], [1, -1], [2, 0], [3, -1]]
    assert batches[None]["tok_mask"] == [[True, True], [True, False], [True, True], [True, False]]
    assert batches[None]["x"] == [1.0, 0.0, 3.0, 4.0]


def test_a_nested_column_a_transform_replaced_reaches_torch_as_it_returned_it(
    ray_session, tmp_path
):
    from rayshard.data.columns import Padding
    from tests.runtime.transform_fns import identity

    tokens = pa.array([[7, 0, 3], [1], [2, 0], [3]], pa.list_(pa.int32()))
    pq.write_table(pa.table({"tok": tokens}), tmp_path / "part.parquet")
    loader = Loader(
        ParquetSource(str(tmp_path)),
        batch_size=4,
        name=unique_name(),
        transform=identity,
        padding={"tok": Padding(nested=True)},
    )
    (batch,) = list(loader.iterator(world_rank=0, world_size=1))
    loader.shutdown()
    assert batch["tok"].is_nested  # values + offsets came back: still one jagged tensor
    assert [t.tolist() for t in batch["tok"].unbind()] == [[7, 0, 3], [1], [2, 0], [3]]


@pytest.mark.parametrize("workers", [{"transform_workers": 2}, {"reader_workers": 2}])
def test_batches_a_filter_emptied_keep_the_columns_whichever_process_ran_it(
    ray_session, tmp_path, workers
):
    from rayshard.data.transforms import per_sample
    from tests.runtime.transform_fns import keep_below_4

    pq.write_table(pa.table({"id": np.arange(12)}), tmp_path / "part.parquet")
    loader = Loader(
        ParquetSource(str(tmp_path)),
        batch_size=4,
        name=unique_name(),
        transform=per_sample(keep_below_4),
        **workers,
    )
    batches = list(loader.iterator(world_rank=0, world_size=1, batch_format="numpy"))
    loader.shutdown()
    assert [sorted(b) for b in batches] == [["_index", "_padded", "v"]] * 3
    assert [len(b["v"]) for b in batches] == [4, 0, 0]
    assert batches[0]["v"].tolist() == [0, 2, 4, 6] and batches[1]["v"].dtype == np.int64
