"""`close()` from another thread while the loop waits for a batch that a read blocked in
the user's code holds up (the torch format's device feed, reading in the training
process): the feed's staging thread, waiting for that batch, is let go at once, and the
close warns of no staging thread left inside the source. (Before, the feed was closed
first: its join waited up to 10 s for the staging thread, then warned, while the reads
that would let it go were stopped only after.)"""

from __future__ import annotations

import threading
import warnings

from rayshard.loader import Loader
from rayshard.sources.torch_map import TorchMapSource
from tests.runtime.helpers import unique_name
from tests.sources.numpy_samples import GatedSamples
from tests.timeouts import EVENT_TIMEOUT_S, event_timeout_message, wait_until


def test_close_from_another_thread_lets_the_waiting_feed_go_first(ray_session):
    # The source reads chunks of 1,024 samples; the second one blocks until the test lets
    # it go, so the loop waits once it took the first chunk's 128 batches.
    dataset = GatedSamples(2048, gate_from=1024)
    source = TorchMapSource(dataset, batch_rows=8)
    loader = Loader(source, batch_size=8, name=unique_name("fc"), consumer_reads=True)
    it = loader.iterator(world_rank=0, world_size=1, batch_format="torch")
    GatedSamples.GATE, GatedSamples.ENTERED = threading.Event(), threading.Event()
    taken: list = []
    outcome: dict = {}

    def run_loop() -> None:
        try:
            for batch in it:
                taken.append(batch["id"])
        except Exception as error:  # noqa: BLE001 - what the waiting loop gets
            outcome["error"] = error

    try:
        waiting = threading.Thread(target=run_loop, daemon=True)
        waiting.start()
        assert GatedSamples.ENTERED.wait(EVENT_TIMEOUT_S), event_timeout_message("the read")
        wait_until(lambda: len(taken) == 128, "the loop to take the first chunk's batches")
        staging = it._feed._thread
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            closer = threading.Thread(target=it.close, daemon=True)
            closer.start()
            staging.join(EVENT_TIMEOUT_S)  # let go while the read still blocks
            assert not staging.is_alive(), "the feed's staging thread still waits"
            GatedSamples.GATE.set()  # the read returns: close() may join its thread
            closer.join(EVENT_TIMEOUT_S)
            waiting.join(EVENT_TIMEOUT_S)
        assert not closer.is_alive() and not waiting.is_alive()
        assert [str(w.message) for w in caught if w.category is RuntimeWarning] == []
        assert "closed" in str(outcome.get("error")), outcome
        assert [int(i) for ids in taken for i in ids] == list(range(1024))
    finally:
        GatedSamples.GATE.set()
        GatedSamples.GATE = GatedSamples.ENTERED = None
        loader.shutdown()
