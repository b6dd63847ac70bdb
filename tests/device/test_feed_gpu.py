"""DeviceFeed and HostBufferPool on CUDA: pinned staging, side-stream copies, record_stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayshard.device import DeviceFeed, HostBufferPool, _staging

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def batches(count: int, rows: int = 256, cols: int = 1024):
    for index in range(count):
        values = np.full((rows, cols), index, dtype=np.float32)
        values.setflags(write=False)  # like arrays from the Ray object store
        yield {"index": np.array([index]), "x": values, "mask": np.ones(rows, dtype=bool)}


def test_pool_buffers_are_page_locked_by_default():
    pool = HostBufferPool()
    assert pool.pinned
    assert pool.acquire(4096).is_pinned()


def test_pinned_buffers_never_shrink_even_at_threshold_one():
    pool = HostBufferPool(shrink_threshold=1.0)
    pool.release(pool.acquire(1 << 20))
    assert pool.acquire(16).numel() == 1 << 20


def test_feed_delivers_correct_batches_in_order_on_the_gpu():
    with DeviceFeed(batches(12), device="cuda", prefetch_depth=3) as feed:
        for expected, batch in enumerate(feed):
            assert batch["x"].device.type == "cuda"
            assert int(batch["index"].item()) == expected
            assert torch.all(batch["x"] == expected).item()
            assert batch["mask"].dtype == torch.bool and bool(batch["mask"].all())
        stats = feed.stats()
    assert stats.batches_delivered == 12 and stats.pinned
    assert 0 < stats.copy_seconds <= stats.stage_seconds  # the CUDA calls, within staging
    assert stats.largest_batch_bytes >= 256 * 1024 * 4


def test_copies_run_on_a_side_stream_and_are_ordered_before_the_consumer():
    feed = DeviceFeed(batches(4), device="cuda")
    side = feed._stager.stream
    assert side is not None and side != torch.cuda.current_stream()
    # Keep the consumer's stream busy: correct results prove it waited on the copy event
    # rather than on a host-side synchronisation.
    totals = []
    for batch in feed:
        torch.cuda._sleep(1_000_000)
        totals.append(batch["x"].sum())
    torch.cuda.synchronize()
    assert [int(t.item()) for t in totals] == [i * 256 * 1024 for i in range(4)]


def test_record_stream_keeps_memory_alive_for_queued_consumer_work():
    feed = DeviceFeed(batches(30, rows=64, cols=256), device="cuda", prefetch_depth=1)
    results = []
    for batch in feed:
        torch.cuda._sleep(2_000_000)  # the read below is queued behind a long kernel
        results.append(batch["x"] * 1.0)
        del batch  # without record_stream the allocator could hand this memory to the next copy
    torch.cuda.synchronize()
    for index, result in enumerate(results):
        assert torch.all(result == index).item(), f"batch {index} was overwritten"


def test_staging_buffers_return_to_the_pool_and_stay_bounded():
    pool = HostBufferPool()
    depth = 2
    with DeviceFeed(batches(20), device="cuda", prefetch_depth=depth, pool=pool) as feed:
        for _ in feed:
            pass
    stats = pool.stats()
    assert stats.in_use == 0
    assert 1 <= stats.num_buffers <= depth + 1


def test_a_feed_empties_its_own_pool_when_it_ends_and_keeps_its_statistics():
    feed = DeviceFeed(batches(6), device="cuda")
    assert len(list(feed)) == 6
    pool = feed._stager.pool
    assert pool.stats().num_buffers == 0  # its pinned blocks are back in torch's host cache
    assert feed.stats().num_buffers >= 1 and feed.stats().pool_bytes >= 256 * 1024 * 4


def test_presize_from_the_hint_means_no_reallocation():
    rows, cols = 256, 1024
    pool = HostBufferPool()
    hint = cols * 4 + 64  # the float column and the mask, with alignment slack
    feed = DeviceFeed(
        batches(8, rows, cols),
        device="cuda",
        pool=pool,
        bytes_per_sample_hint=hint,
        batch_size=rows,
    )
    list(feed)
    assert pool.stats().reallocations == 0
    assert pool.stats().allocations == 3  # prefetch_depth + 1 presized buffers


def test_pinned_buffers_are_the_power_of_two_torch_locks():
    pool = HostBufferPool(growth_factor=1.0)
    buffer = pool.acquire(3000)
    assert buffer.is_pinned() and buffer.numel() == 4096
    assert pool.stats().pool_bytes == 4096


def test_a_jagged_column_rides_the_batch_copy_and_is_ordered_before_the_consumer():
    """Jagged token rows beside a staged column: the consumer's stream is kept busy, so
    correct sums prove it waited on the copy's event, which covers the jagged parts."""

    def source():
        for index in range(6):
            lengths = [3, 0, 5, 2]
            offsets = torch.tensor(np.cumsum([0, *lengths]), dtype=torch.int64)
            values = torch.full((sum(lengths),), float(index))
            yield {
                "tokens": torch.nested.nested_tensor_from_jagged(values, offsets),
                "x": np.full((4, 8), index, dtype=np.float32),
            }

    sums = []
    with DeviceFeed(source(), device="cuda", prefetch_depth=2) as feed:
        for batch in feed:
            assert batch["tokens"].is_nested and batch["tokens"].device.type == "cuda"
            tokens_memory = batch["tokens"].values().untyped_storage().data_ptr()
            assert tokens_memory == batch["x"].untyped_storage().data_ptr()  # one copy
            torch.cuda._sleep(1_000_000)
            sums.append((batch["tokens"].values().sum(), batch["x"].sum()))
            del batch
    torch.cuda.synchronize()
    assert [(int(t.item()), int(x.item())) for t, x in sums] == [(10 * i, 32 * i) for i in range(6)]


def test_a_tensor_already_on_the_device_passes_through():
    on_device = torch.arange(8, device="cuda")
    (batch,) = list(DeviceFeed([{"t": on_device, "x": np.arange(8)}], device="cuda"))
    assert batch["t"] is on_device
    assert batch["x"].device.type == "cuda"


def test_a_list_of_per_row_arrays_rides_the_batch_copy_ordered_before_the_consumer():
    boxes = [np.full((rows, 4), rows, dtype=np.float32) for rows in (2, 0, 5)]
    with DeviceFeed([{"boxes": boxes, "x": np.ones(3)}] * 3, device="cuda") as feed:
        for batch in feed:
            torch.cuda._sleep(1_000_000)  # the consumer's stream is busy: it waits the event
            assert [box.device.type for box in batch["boxes"]] == ["cuda"] * 3
            assert [int(box.sum().item()) for box in batch["boxes"]] == [16, 0, 100]


def test_a_device_index_this_process_does_not_see_is_a_config_error():
    from rayshard.errors import ConfigError

    missing = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ConfigError, match=rf"device='{missing}'.*sees"):
        DeviceFeed([], device=missing)


def test_a_jagged_batch_memory_is_not_reused_while_the_consumer_still_reads_it():
    """The batch's memory (here only a jagged column's parts) is recorded on the consumer's
    stream: dropped while a long kernel queued before its read still runs, it is not handed
    to a new allocation on the copy stream."""
    values = torch.arange(4096.0)
    tokens = torch.nested.nested_tensor_from_jagged(values, torch.tensor([0, 1000, 4096]))
    feed = DeviceFeed([{"tokens": tokens}], device="cuda")
    (batch,) = list(feed)
    torch.cuda._sleep(200_000_000)  # the consumer's stream stays busy for a long while
    used = batch["tokens"].values()
    address, total = used.data_ptr(), used.sum()
    del batch, used
    size = _staging.plan_layout({"tokens": tokens}, torch.device("cuda")).nbytes
    with torch.cuda.stream(feed._stager.stream):  # the batch's size: its block would fit
        probe = torch.empty(size, dtype=torch.uint8, device="cuda")
    assert probe.data_ptr() != address
    torch.cuda.synchronize()
    assert int(total.item()) == 4095 * 4096 // 2


def test_jagged_with_holes_and_strided_nested_tensors_arrive_whole():
    values = torch.arange(10.0)
    holes = torch.nested.nested_tensor_from_jagged(
        values, torch.tensor([0, 4, 10]), lengths=torch.tensor([2, 5])
    )
    strided = torch.nested.nested_tensor([torch.ones(2), torch.zeros(3)])
    (batch,) = list(DeviceFeed([{"holes": holes, "strided": strided}], device="cuda"))
    torch.cuda.synchronize()
    assert batch["holes"].device.type == "cuda"
    assert batch["holes"].lengths().tolist() == [2, 5]
    assert batch["holes"].values().cpu().tolist() == values.tolist()
    assert [t.cpu().tolist() for t in batch["strided"].unbind()] == [[1.0, 1.0], [0.0] * 3]


def test_a_cuda_column_for_a_cpu_feed_arrives_complete():
    """To the CPU the move is a blocking copy: the loop reads the values, not a copy still
    in flight."""
    on_device = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    torch.cuda._sleep(500_000_000)  # the copy waits behind a long kernel
    (batch,) = list(DeviceFeed([{"t": on_device * 2}], device="cpu"))
    assert batch["t"].device.type == "cpu"
    assert batch["t"][-1].item() == 2 * ((1 << 20) - 1)
