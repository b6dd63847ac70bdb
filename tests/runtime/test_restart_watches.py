"""A restarted coordinator and its watches, run in this process as Ray runs the actor
(its restart check patched; Ray only for the runtime context and actor lookups): it
compacts the journal it replayed, records a dropped iterator's loss before `end_watch`
returns, looks a while for a reader Ray does not know yet, and refuses to attach a reader
to a rank lost since it registered."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import pyarrow as pa
import pytest
import ray

from rayshard.config.loader_config import LoaderConfig
from rayshard.errors import StaleClientError
from rayshard.runtime import coordinator, journal, pid_watch
from rayshard.runtime.reader_watches import ReaderWatches
from rayshard.runtime.remote import remote_class
from rayshard.runtime.watch import RankWatch
from rayshard.sources import TableSource
from tests.timeouts import EVENT_TIMEOUT_S

SETTINGS = LoaderConfig(batch_size=8, policy="dynamic", equal_steps=False)
SOURCE = TableSource(pa.table({"id": pa.array(range(200), pa.int64())}))
DP = {"dp_rank": 0, "dp_size": 1}


def _coordinator(path, restarted: bool, monkeypatch) -> coordinator.Coordinator:
    monkeypatch.setattr(journal, "actor_was_restarted", lambda: restarted)
    return coordinator.Coordinator("restarts", SOURCE, SETTINGS, "ns", str(path))


def _ops(path) -> list[str]:
    return [json.loads(line)["op"] for line in path.read_text().splitlines()]


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])


def _token(child: subprocess.Popen) -> str:
    node, start = ray.get_runtime_context().get_node_id(), pid_watch.start_ticks(child.pid)
    return f"pid:{node}:{pid_watch.pid_namespace()}:{child.pid}:{start}"


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.02)


def test_a_restarted_coordinator_compacts_what_it_replayed(ray_session, tmp_path, monkeypatch):
    path = tmp_path / "journal.jsonl"

    async def run() -> None:
        live = _coordinator(path, False, monkeypatch)
        generation = (await live.register(0, 1, DP))["generation"]
        await live.start_epoch(generation, 0, 0)
        for n in range(3):
            await live.lease(generation, 0, 0, 1, request=f"r:{n}")
        assert _ops(path) == ["header", "register", "epoch", "lease", "lease", "lease"]
        live._journal.close(remove=False)  # its process died
        again = _coordinator(path, True, monkeypatch)
        assert _ops(path) == ["header", "snapshot"]  # not replayed again by a next restart
        assert (await again.describe())["journal_commands_since_snapshot"] == 0
        snapshot = json.loads(path.read_text().splitlines()[1])["state"]
        assert snapshot["events"][-1]["event"] == "coordinator_restarted"

    asyncio.run(run())


@pytest.mark.skipif(not pid_watch.pidfds_work(), reason="no pidfds on this system")
def test_end_watch_right_after_a_restart_records_the_loss(ray_session, tmp_path, monkeypatch):
    path, child = tmp_path / "journal.jsonl", _sleeper()

    async def run() -> None:
        live = _coordinator(path, False, monkeypatch)
        registered = await live.register(0, 1, DP)
        name = registered["reader"]
        assert await live.attach_reader(registered["generation"], 0, name, _token(child))
        live._journal.close(remove=False)  # its process died
        again = _coordinator(path, True, monkeypatch)
        await again.end_watch(name)  # the worker dropped its iterator: the first call
        assert 0 not in again._core.members.ranks
        assert again._core.events[-1]["event"] == "rank_lost"

    try:
        asyncio.run(run())
    finally:
        child.kill()
        child.wait()


def test_attaching_a_reader_to_a_rank_lost_since_is_refused(ray_session, tmp_path, monkeypatch):
    async def run() -> None:
        live = _coordinator(tmp_path / "journal.jsonl", False, monkeypatch)
        registered = await live.register(0, 2, {"dp_rank": 0, "dp_size": 2})
        await live.register(1, 2, {"dp_rank": 1, "dp_size": 2})
        generation, name = registered["generation"], registered["reader"]
        await live.leave(generation, 0)
        with pytest.raises(StaleClientError, match="data-parallel rank 0 was lost"):
            await live.attach_reader(generation, 0, name)
        assert 0 not in live._core.members.readers

    asyncio.run(run())


def test_a_reader_ray_does_not_know_yet_is_looked_for_before_it_counts_as_ended(ray_session):
    namespace, ends = f"watch-find-{uuid.uuid4().hex[:8]}", []
    watch_name, child = f"late-watch-{uuid.uuid4().hex[:8]}", _sleeper()

    async def ended(dp_rank: int, name: str, released: bool) -> None:
        ends.append(name)

    async def run() -> None:
        watches = ReaderWatches(namespace, ended)
        watches.watch(0, "gone", None)  # not looked for: ended at once
        await asyncio.wait_for(_until(lambda: ends == ["gone"]), EVENT_TIMEOUT_S)
        watches.watch(1, "late", watch_name, find_s=EVENT_TIMEOUT_S)
        await asyncio.sleep(1.0)
        options = {"name": watch_name, "namespace": namespace, "num_cpus": 0}
        late = remote_class(RankWatch).options(**options).remote()  # made after the watch
        await asyncio.sleep(1.0)
        assert ends == ["gone"]
        await late.end_watch.remote("late")
        await asyncio.wait_for(_until(lambda: ends == ["gone", "late"]), EVENT_TIMEOUT_S)
        # An attach while its actor is looked for arms the rank's watch anew (here: by pid).
        watches.watch(2, "by-pid", None, find_s=1.0)
        if pid_watch.pidfds_work():
            watches.watch(2, "by-pid", _token(child))
            await asyncio.sleep(2.0)
            assert ends == ["gone", "late"]
            child.kill()
        await asyncio.wait_for(_until(lambda: ends[-1] == "by-pid"), EVENT_TIMEOUT_S)
        ray.kill(late)

    try:
        asyncio.run(run())
    finally:
        child.kill()
        child.wait()
