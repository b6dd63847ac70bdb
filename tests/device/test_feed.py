"""DeviceFeed on the CPU path: order, prefetch bound, errors in place, close, accounting."""

from __future__ import annotations

import gc
import threading
import time
import warnings

import numpy as np
import pytest
import torch

from rayshard.device import DeviceFeed, default_device
from tests.timeouts import EVENT_TIMEOUT_S, wait_until

THREAD_NAME = "rayshard-device-feed"


class Counting:
    """A source that counts how many batches have been read from it."""

    def __init__(self, total: int | None = None, fail_at: int | None = None) -> None:
        self.read = 0
        self.total = total
        self.fail_at = fail_at

    def __iter__(self):
        index = 0
        while self.total is None or index < self.total:
            if index == self.fail_at:
                raise KeyError(f"broken batch {index}")
            self.read += 1
            yield {"index": np.array([index]), "x": np.full((4, 3), index, dtype=np.float32)}
            index += 1


def feed_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def test_batches_arrive_in_order_as_cpu_tensors():
    with DeviceFeed(Counting(total=25), device="cpu") as feed:
        batches = list(feed)
    assert [int(b["index"][0]) for b in batches] == list(range(25))
    assert all(b["x"].device.type == "cpu" and b["x"].dtype == torch.float32 for b in batches)
    assert torch.equal(batches[7]["x"], torch.full((4, 3), 7.0))
    assert feed.batches_delivered == 25


def test_mixed_dtypes_zero_size_and_read_only_arrays_convert_without_warnings():
    source = [
        {
            "f16": read_only(np.arange(6, dtype=np.float16).reshape(2, 3)),
            "big_endian": read_only(np.arange(2, dtype=">i4")),
            "flags": np.array([True, False]),
            "u8": np.array([[255], [1]], dtype=np.uint8),
            "c64": np.array([1 + 2j, 3j], dtype=np.complex64),
            "empty": np.zeros((0, 5), dtype=np.int16),
            "strided": np.arange(10, dtype=np.int64)[::-2],
            "tensor": torch.tensor([1.5, 2.5], dtype=torch.bfloat16),
            "scalar": np.float64(2.5),
        }
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (batch,) = list(DeviceFeed(source, device="cpu"))
    expected = {
        "f16": torch.arange(6, dtype=torch.float16).reshape(2, 3),
        "big_endian": torch.tensor([0, 1], dtype=torch.int32),
        "flags": torch.tensor([True, False]),
        "u8": torch.tensor([[255], [1]], dtype=torch.uint8),
        "c64": torch.tensor([1 + 2j, 3j], dtype=torch.complex64),
        "empty": torch.zeros((0, 5), dtype=torch.int16),
        "strided": torch.tensor([9, 7, 5, 3, 1]),
        "tensor": torch.tensor([1.5, 2.5], dtype=torch.bfloat16),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }
    assert list(batch) == list(expected)
    for key, value in expected.items():
        assert batch[key].dtype == value.dtype, key
        assert torch.equal(batch[key], value), key


def test_lists_per_row_stay_lists_whatever_their_shape_and_flat_numbers_are_staged():
    """Rows as Python lists (strings, nested lists: as the README says they arrive under
    `torch`) pass through as lists in every batch, rectangular or not; a flat list of
    numbers (what a `collate_fn` may return) becomes a tensor."""
    source = [
        {"grid": [[[0.5, 1.0], [2.0, 3.0]], [[4.0, 5.0], [6.0, 7.0]]], "label": [3, 4]},
        {"grid": [[[0.5, 1.0]], [[4.0], [6.0, 7.0]]], "label": [5, 6]},
    ]
    batches = list(DeviceFeed(source, device="cpu"))
    assert [b["grid"] for b in batches] == [s["grid"] for s in source]
    assert all(type(b["grid"]) is list for b in batches)
    assert [b["label"].tolist() for b in batches] == [[3, 4], [5, 6]]
    assert all(isinstance(b["label"], torch.Tensor) for b in batches)
    # Rows as arrays (a tokenizer's per-row ids): a list whether or not they share a length,
    # of tensors (each viewing its array)
    ids = [
        {"ids": [np.arange(2, dtype=np.int32), np.arange(3, dtype=np.int32)]},
        {"ids": [np.arange(5, dtype=np.int32), np.arange(5, dtype=np.int32)]},
        {"ids": [torch.arange(4)]},
    ]
    staged = [b["ids"] for b in DeviceFeed(ids, device="cpu")]
    assert all(type(rows) is list for rows in staged)
    assert all(isinstance(row, torch.Tensor) for rows in staged for row in rows)
    assert staged[0][1].data_ptr() == ids[0]["ids"][1].ctypes.data
    assert [[list(map(int, row)) for row in rows] for rows in staged] == [
        [[0, 1], [0, 1, 2]],
        [[0, 1, 2, 3, 4]] * 2,
        [[0, 1, 2, 3]],
    ]
    # A batch whose rows a transform all dropped: its text column stays a list, not an
    # empty float64 tensor (the type would then depend on the batch)
    empty = next(iter(DeviceFeed([{"text": [], "label": np.arange(0)}], device="cpu")))
    assert empty["text"] == [] and type(empty["text"]) is list
    assert empty["label"].dtype == torch.int64 and empty["label"].shape == (0,)


def test_cpu_batches_view_the_source_arrays_without_a_copy():
    """Must-hold 4 (issue 12): on the CPU the feed hands over the host arrays' memory, read-only
    object-store arrays included, with no per-batch copy and no warning."""
    x = read_only(np.arange(4096, dtype=np.float32).reshape(64, 64))
    label = read_only(np.arange(64, dtype=np.int64))
    strided = read_only(np.arange(128, dtype=np.int32)[::2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (batch,) = list(DeviceFeed([{"x": x, "label": label, "s": strided}], device="cpu"))
    assert batch["x"].data_ptr() == x.ctypes.data
    assert batch["label"].data_ptr() == label.ctypes.data
    assert batch["s"].data_ptr() == strided.ctypes.data and batch["s"].stride() == (2,)
    assert torch.equal(batch["x"], torch.arange(4096, dtype=torch.float32).reshape(64, 64))
    del x, label, strided
    gc.collect()  # the tensors keep their source arrays alive
    assert int(batch["label"][-1]) == 63 and float(batch["x"][63, 63]) == 4095.0


def test_arrays_torch_cannot_view_are_copied_on_the_cpu():
    big_endian = read_only(np.arange(4, dtype=">i4"))
    reversed_ = np.arange(4, dtype=np.int64)[::-1]
    (batch,) = list(DeviceFeed([{"b": big_endian, "r": reversed_}], device="cpu"))
    assert batch["b"].tolist() == [0, 1, 2, 3] and batch["r"].tolist() == [3, 2, 1, 0]
    assert batch["b"].dtype == torch.int32


def test_an_empty_source_ends_at_once_and_stays_ended():
    feed = DeviceFeed(iter([]), device="cpu")
    assert list(feed) == []
    with pytest.raises(StopIteration):
        next(feed)


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_source_is_read_at_most_prefetch_depth_plus_one_ahead(depth):
    source = Counting()
    with DeviceFeed(source, device="cpu", prefetch_depth=depth) as feed:
        feed.start()
        wait_until(lambda: source.read == depth + 1, "the feed to read ahead", poll=0.005)
        time.sleep(0.1)  # give an unbounded feed the chance to read on
        assert source.read == depth + 1
        for taken in range(1, 4):
            next(feed)
            wait_until(
                lambda taken=taken: source.read == taken + depth + 1,
                "the feed to read ahead again",
                poll=0.005,
            )
            time.sleep(0.05)
            assert source.read == taken + depth + 1


def test_delivered_count_excludes_prefetched_batches():
    source = Counting()
    with DeviceFeed(source, device="cpu", prefetch_depth=4) as feed:
        taken = [next(feed) for _ in range(3)]
        wait_until(lambda: source.read == 3 + 4 + 1, "the feed to read ahead", poll=0.005)
        assert feed.batches_delivered == 3
        assert feed.stats().batches_delivered == 3
        assert [int(b["index"][0]) for b in taken] == [0, 1, 2]


def test_source_exception_is_raised_after_every_earlier_batch():
    feed = DeviceFeed(Counting(total=10, fail_at=3), device="cpu", prefetch_depth=3)
    got = [int(next(feed)["index"][0]) for _ in range(3)]
    assert got == [0, 1, 2]
    with pytest.raises(KeyError, match="broken batch 3"):
        next(feed)
    assert feed.batches_delivered == 3
    with pytest.raises(StopIteration):
        next(feed)
    assert feed_threads() == []


def test_collate_fn_is_applied_and_its_errors_arrive_in_place():
    def collate(pair):
        label, values = pair
        if label == "bad":
            raise ValueError("cannot collate")
        return {"label": np.array([len(label)]), "values": np.asarray(values) * 10}

    source = [("a", [1, 2]), ("bbb", [3]), ("bad", []), ("never", [0])]
    feed = DeviceFeed(source, device="cpu", collate_fn=collate)
    first, second = next(feed), next(feed)
    assert torch.equal(first["values"], torch.tensor([10, 20]))
    assert int(second["label"][0]) == 3
    with pytest.raises(ValueError, match="cannot collate"):
        next(feed)


def test_non_dict_batch_and_unsupported_dtype_fail_with_a_named_fix():
    with pytest.raises(TypeError, match="make the collate_fn return one of those"):
        next(DeviceFeed(["text"], device="cpu"))
    with pytest.raises(TypeError, match="column 'name' has numpy dtype"):
        next(DeviceFeed([{"name": np.array(["a", "b"])}], device="cpu"))


def test_close_stops_the_thread_and_the_reading():
    source = Counting()
    feed = DeviceFeed(source, device="cpu", prefetch_depth=2)
    next(feed)
    wait_until(lambda: source.read == 4, "the source's 4th batch", poll=0.005)
    assert len(feed_threads()) == 1
    feed.close()
    assert feed_threads() == []
    read = source.read
    time.sleep(0.05)
    assert source.read == read
    with pytest.raises(StopIteration):
        next(feed)
    feed.close()  # twice is fine


def test_close_before_start_starts_nothing():
    source = Counting()
    feed = DeviceFeed(source, device="cpu")
    feed.close()
    assert list(feed) == []
    assert source.read == 0 and feed_threads() == []


def test_abandoned_feed_stops_its_thread():
    feed = DeviceFeed(Counting(), device="cpu")
    next(feed)
    (thread,) = feed_threads()
    del feed
    gc.collect()
    thread.join(timeout=60)  # a bound, not a wait: the thread ends as soon as it sees it
    assert not thread.is_alive()


def test_exit_hook_stops_and_joins_a_running_feed_that_was_never_closed():
    """At interpreter exit a still-referenced, unclosed feed's thread is stopped and joined
    (a daemon thread left running into finalization can abort the process)."""
    from rayshard.device import _producer

    source = Counting()
    feed = DeviceFeed(source, device="cpu", prefetch_depth=2)
    next(feed)
    (thread,) = feed_threads()
    assert thread in _producer.LIVE
    _producer.stop_live_threads()
    assert not thread.is_alive()
    assert thread not in _producer.LIVE
    read = source.read
    time.sleep(0.05)
    assert source.read == read
    feed.close()


def asked_for(count: int, asked: threading.Event, hold_s: float = 0.0):
    """A source that makes batch i only once the consumer has waited for it (`asked`, set
    by the feed's `on_wait`), then takes `hold_s` to make it: the consumer's waits are
    ordered by events, whatever the machine's load. If `asked` never comes it goes on after
    the event timeout, and the caller's assertions fail."""
    for index in range(count):
        asked.wait(EVENT_TIMEOUT_S)
        asked.clear()
        time.sleep(hold_s)
        yield {"index": np.array([index])}


def test_stall_time_counts_waiting_for_a_slow_source():
    asked = threading.Event()
    source = asked_for(5, asked, hold_s=0.04)
    with DeviceFeed(source, device="cpu", on_wait=asked.set) as feed:
        assert len(list(feed)) == 5
        assert feed.stats().stall_seconds >= 5 * 0.04  # each wait outlasted its batch's making


def test_on_wait_is_called_only_when_the_consumer_waits():
    waits = []
    asked = threading.Event()

    def on_wait():
        waits.append(1)
        asked.set()

    with DeviceFeed(asked_for(3, asked), device="cpu", on_wait=on_wait) as feed:
        assert len(list(feed)) == 3
    assert len(waits) >= 3  # every batch (and the end) came after the consumer asked

    def slow():
        for index in range(3):
            time.sleep(0.1)
            yield {"index": np.array([index])}

    waits.clear()
    feed = DeviceFeed(slow(), device="cpu", on_wait=lambda: waits.append(1), on_wait_after_s=60)
    with feed:
        assert len(list(feed)) == 3
    assert waits == []  # the consumer waited, but never for 60 s

    waits.clear()
    ready = [{"index": np.array([i])} for i in range(2)]
    with DeviceFeed(ready, device="cpu", on_wait=lambda: waits.append(1)) as feed:
        feed.start()
        wait_until(lambda: len(feed._channel) == 2, "2 batches staged", poll=0.005)
        next(feed), next(feed)
    assert waits == []  # both batches were waiting in the queue


def test_stats_track_batch_bytes_on_cpu():
    source = [{"x": np.zeros((8, 100), dtype=np.float32)}, {"x": np.zeros((2, 10), np.float32)}]
    with DeviceFeed(source, device="cpu") as feed:
        list(feed)
        stats = feed.stats().as_dict()
    assert stats["largest_batch_bytes"] == 3200
    assert stats["max_bytes_per_sample"] == 400
    assert (stats["device"], stats["pinned"], stats["pool_bytes"]) == ("cpu", False, 0)


def test_cpu_tensors_for_the_cpu_pass_through_without_a_copy():
    tensor = torch.arange(4)
    (batch,) = list(DeviceFeed([{"t": tensor}], device="cpu"))
    assert batch["t"] is tensor


@pytest.mark.parametrize("depth", [0, -1, 1.5, True])
def test_bad_prefetch_depth_is_rejected(depth):
    with pytest.raises(ValueError, match="prefetch_depth="):
        DeviceFeed([], device="cpu", prefetch_depth=depth)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_device_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA is not available"):
        DeviceFeed([], device="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU default")
def test_default_device_is_the_cpu_outside_ray_train():
    assert default_device() == torch.device("cpu")
    assert DeviceFeed([]).device == torch.device("cpu")


def test_tags_travel_with_their_batches_through_the_staging_thread():
    """A `Tagged(tag, batch)` source item comes out as `Tagged(tag, staged batch)`, in order,
    with `collate_fn` applied to the batch alone (the loader's metadata rides this way)."""
    from rayshard.data.batching import Tagged

    source = [Tagged(("meta", i), {"x": np.full(3, i, dtype=np.int64)}) for i in range(6)]

    def double(batch):
        return {"x": batch["x"] * 2}

    with DeviceFeed(iter(source), device="cpu", prefetch_depth=2, collate_fn=double) as feed:
        out = list(feed)
    assert [item.tag for item in out] == [("meta", i) for i in range(6)]
    for i, item in enumerate(out):
        assert isinstance(item.batch["x"], torch.Tensor)
        assert item.batch["x"].tolist() == [2 * i] * 3


@pytest.mark.parametrize("shape", [tuple, list])
def test_a_collate_fn_may_return_a_tuple_or_list_of_arrays(shape):
    source = [{"x": np.arange(6.0).reshape(3, 2), "y": np.arange(3), "s": ["a", "b", "c"]}]

    def collate(batch):
        return shape([batch["x"], batch["y"], batch["s"]])

    (batch,) = list(DeviceFeed(source, device="cpu", collate_fn=collate))
    assert type(batch) is shape and len(batch) == 3
    x, y, s = batch
    assert isinstance(x, torch.Tensor) and x.tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert isinstance(y, torch.Tensor) and y.tolist() == [0, 1, 2] and s == ["a", "b", "c"]
    with pytest.raises(TypeError, match="got int; make the collate_fn return one of those"):
        list(DeviceFeed(source, device="cpu", collate_fn=lambda batch: 5))
    # a tuple inside it (labels and a bool mask) was stacked into one int64 tensor
    inner = (y.numpy(), y.numpy() > 0)  # labels and their mask
    with pytest.raises(TypeError, match=r"batch entry '1' is a tuple inside the batch"):
        list(DeviceFeed(source, device="cpu", collate_fn=lambda b: shape([b["x"], inner])))
    with pytest.raises(TypeError, match=r"batch entry 'meta' is a dict inside the batch"):
        list(DeviceFeed(source, device="cpu", collate_fn=lambda b: {"meta": {"a": b["y"]}}))
    sizes = next(DeviceFeed(source, device="cpu", collate_fn=lambda b: {"hw": (3, 4)}))
    assert sizes["hw"].tolist() == [3, 4]  # a tuple of numbers is staged, as before


def test_a_stop_iteration_from_collate_fn_is_an_error_not_the_end():
    def collate(batch):
        raise StopIteration  # (a `next()` on an exhausted iterator inside it)

    with pytest.raises(RuntimeError, match="staging a batch raised StopIteration"):
        list(DeviceFeed([{"x": np.arange(3)}] * 3, device="cpu", collate_fn=collate))


def test_cpu_with_an_index_is_the_host_for_jagged_columns_too():
    for device in ("cpu:0", torch.device("cpu", 0)):
        (batch,) = list(DeviceFeed([{"tokens": jagged([2, 1]), "y": np.arange(2)}], device=device))
        assert batch["tokens"].is_nested and batch["y"].tolist() == [0, 1]


def jagged(lengths: list[int]) -> torch.Tensor:
    offsets = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)
    return torch.nested.nested_tensor_from_jagged(torch.arange(float(sum(lengths))), offsets)


def test_a_nested_tensor_for_the_cpu_passes_through_as_it_is():
    nested = jagged([2, 0, 3])
    (batch,) = list(DeviceFeed([{"tokens": nested, "y": np.arange(3)}], device="cpu"))
    assert batch["tokens"] is nested
    assert batch["y"].tolist() == [0, 1, 2]


def test_a_jagged_tensor_goes_to_another_device_in_the_batch_copy():
    """Off the CPU and off CUDA (torch's `meta` device stands in: no data, real placement),
    a jagged tensor arrives jagged, beside the staged columns, in the batch's order."""
    source = [{"x": np.arange(4.0), "tokens": jagged([1, 3]), "ids": ["a", "b"]}]
    (batch,) = list(DeviceFeed(source, device="meta"))
    assert list(batch) == ["x", "tokens", "ids"]
    assert batch["x"].device.type == "meta" and batch["x"].shape == (4,)
    assert batch["tokens"].is_nested and batch["tokens"].device.type == "meta"
    assert batch["ids"] == ["a", "b"]


def test_a_list_of_per_row_arrays_reaches_the_device_as_a_list_of_its_tensors():
    """A `collate_fn`'s list of per-row arrays (boxes per image) rides the batch's copy:
    each comes as a tensor on the device, in its own shape and dtype, in a list."""
    boxes = [np.zeros((2, 4), np.float32), np.zeros((0, 4), np.float32), np.ones((3, 4))]
    source = [{"image": np.zeros((3, 8), np.uint8), "boxes": boxes, "ids": ["a", "b", "c"]}]
    for device in ("meta", "cpu"):
        (batch,) = list(DeviceFeed(source, device=device))
        assert list(batch) == ["image", "boxes", "ids"] and type(batch["boxes"]) is list
        assert [box.device.type for box in batch["boxes"]] == [device] * 3
        assert [tuple(box.shape) for box in batch["boxes"]] == [(2, 4), (0, 4), (3, 4)]
        assert [box.dtype for box in batch["boxes"]] == [torch.float32] * 2 + [torch.float64]
        assert batch["ids"] == ["a", "b", "c"]
    # in a tuple a collate_fn returns, too; a list of 0-d arrays is still one tensor
    (x, rows, flat) = next(
        iter(
            DeviceFeed([(np.arange(2), [np.arange(3), np.arange(1)], [np.int64(4)])], device="meta")
        )
    )
    assert [tuple(row.shape) for row in rows] == [(3,), (1,)]
    assert rows[0].device.type == "meta" and flat.shape == (1,)


@pytest.mark.parametrize("holes", [False, True])
def test_a_jagged_tensor_is_staged_as_its_parts_and_joined_again(holes):
    """Its values, offsets (and lengths, with holes) are columns of the one staging buffer;
    the views of the filled buffer join into the same jagged tensor."""
    from rayshard.device import _staging

    values = torch.arange(12.0).reshape(6, 2)
    offsets = torch.tensor([0, 2, 2, 6])
    lengths = torch.tensor([1, 0, 3]) if holes else None
    tokens = torch.nested.nested_tensor_from_jagged(values, offsets, lengths=lengths)
    layout = _staging.plan_layout({"tokens": tokens, "y": np.arange(3)}, torch.device("meta"))
    parts = ["values", "offsets", "lengths"] if holes else ["values", "offsets"]
    assert [c.key for c in layout.columns] == [*[("tokens", p) for p in parts], "y"]
    assert [join.key for join in layout.jagged] == ["tokens"] and not layout.moves
    assert layout.num_samples == 3
    buffer = torch.empty(layout.nbytes, dtype=torch.uint8)
    _staging.fill(buffer, layout)
    joined = _staging.views(buffer, layout)["tokens"]
    assert joined.is_nested and joined.layout == torch.jagged
    assert torch.equal(joined.values(), values) and torch.equal(joined.offsets(), offsets)
    assert (joined.lengths() is None) != holes
    if holes:
        assert torch.equal(joined.lengths(), lengths)
    assert joined.values().data_ptr() == buffer.data_ptr()  # a view: no copy of its own
    # its sequence lengths known without a look at the (device) offsets
    assert (joined._maybe_min_seqlen, joined._maybe_max_seqlen) == ((0, 3) if holes else (0, 4))
    if not holes:  # padded to the longest row (the original, uncached: to every token)
        assert joined.to_padded_tensor(0.0).shape == (3, 4, 2)


def test_jagged_columns_on_one_offsets_tensor_stay_compatible_and_keep_cached_seqlens():
    """`input_ids` and `labels` built on the same offsets: the offsets are staged once and
    both joined on the same view, so they still add up; a cached max length survives."""
    from rayshard.device import _staging

    ids = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    labels = torch.nested.nested_tensor_from_jagged(torch.arange(5.0), ids.offsets())
    layout = _staging.plan_layout({"ids": ids, "labels": labels}, torch.device("meta"))
    assert [c.key for c in layout.columns] == [
        ("ids", "values"),
        ("ids", "offsets"),
        ("labels", "values"),
    ]
    buffer = torch.empty(layout.nbytes, dtype=torch.uint8)
    _staging.fill(buffer, layout)
    joined = _staging.views(buffer, layout)
    assert torch.equal((joined["ids"] + joined["labels"]).values(), torch.arange(5.0) + 1)
    assert (joined["ids"]._maybe_min_seqlen, joined["ids"]._maybe_max_seqlen) == (2, 3)


def test_the_staging_thread_times_waiting_for_the_source():
    """A source that sleeps 0.1 s before each of its 4 batches: the thread waited for it at
    least that long, and the three phases never exceed the feed's whole life."""

    def slow():
        for index in range(4):
            time.sleep(0.1)
            yield {"x": np.full(3, index)}

    started = time.perf_counter()
    with DeviceFeed(slow(), device="cpu") as feed:
        assert [int(b["x"][0]) for b in feed] == [0, 1, 2, 3]
        stats = feed.stats()
    lifetime = time.perf_counter() - started
    assert stats.source_seconds >= 0.4
    assert min(stats.stage_seconds, stats.handover_seconds) >= 0
    assert stats.copy_seconds == 0  # no CUDA call on the CPU
    assert stats.source_seconds + stats.stage_seconds + stats.handover_seconds <= lifetime


def test_the_staging_thread_times_waiting_for_the_consumer():
    """The consumer takes nothing for 1 s after the second batch was asked of the source.
    That second lies inside the second batch's own time (from asking the source to the
    hand-over), so the phases hold at least 1 s, all but its read and packing handing
    over: the bound holds however slow the machine is."""
    asked_second = threading.Event()

    def source():
        yield {"x": np.zeros(3)}
        asked_second.set()
        yield {"x": np.ones(3)}

    with DeviceFeed(source(), device="cpu", prefetch_depth=1) as feed:
        feed.start()
        assert asked_second.wait(EVENT_TIMEOUT_S)
        time.sleep(1.0)
        assert len(list(feed)) == 2
        stats = feed.stats()
    assert stats.handover_seconds >= 1.0 - stats.source_seconds - stats.stage_seconds, stats
