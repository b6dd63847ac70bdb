"""README claims without Ray, each checked against the code that makes it true:

- the coordinator compacts its journal every `COMPACT_EVERY` (20,000) changes, and a
  restart from the compacted journal rebuilds the same state;
- a journal of an older format is refused with a `ConfigError` naming it;
- remote I/O is retried `READ_ATTEMPTS` (6) times with back-off 0.25 s doubling (about
  8 s of outage) before a `DataError` reaches the loop;
- a local `PermissionError` (and a store's refusal) is a `ReadDeniedError` naming the
  file, not retried;
- a mixed epoch holds at most `MAX_EPOCH_SAMPLES` (3e9) samples;
- the defaults in brackets in the README's list of configuration keys are the dataclass
  defaults of `PlanConfig`, `ReadConfig` and `RuntimeConfig`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import types
from enum import Enum
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from rayshard.config.loader_config import PARTS, LoaderConfig
from rayshard.core import commands as cmd
from rayshard.core.mixing import MAX_EPOCH_SAMPLES
from rayshard.errors import ConfigError, DataError, ReadDeniedError
from rayshard.runtime import coordinator, journal
from rayshard.runtime.journal import JOURNAL_VERSION, Journal
from rayshard.sources import TableSource, cache
from rayshard.sources.mixed import MixedSource
from rayshard.sources.parquet import ParquetSource

README = Path(__file__).resolve().parents[1] / "README.md"


# -- journal compaction (README: "compacted ... every 20,000 changes") ----------------------
def _table_source(rows: int = 120) -> TableSource:
    table = pa.table({"id": pa.array(range(rows), pa.int64())})
    return TableSource(pa.Table.from_batches(table.to_batches(max_chunksize=10)))


def _json(state: dict) -> dict:
    """`state` as the journal holds it (tuples as lists)."""
    return json.loads(json.dumps(state))


def _ops(path: Path) -> list[str]:
    return [json.loads(line)["op"] for line in path.read_text().splitlines()]


def _coordinator(path: Path, source: TableSource, restarted: bool, monkeypatch):
    """The coordinator actor's class, run in this process as Ray would run it (its
    `actor_was_restarted` reads Ray's runtime context, which only an actor process has)."""
    monkeypatch.setattr(journal, "actor_was_restarted", lambda: restarted)
    settings = LoaderConfig(batch_size=8, policy="dynamic", equal_steps=False)
    return coordinator.Coordinator("readme-compact", source, settings, "ns", str(path))


@pytest.fixture
def event_loop_of_this_thread():
    """An event loop set as this thread's for the test: the coordinator makes its watch
    tasks on the current loop, which in its actor is running. Made here, not left to
    `asyncio.get_event_loop()`, which raises once any `asyncio.run()` ran in this thread
    before (as another test in the same worker may)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    for task in asyncio.all_tasks(loop):  # watches made, never run: no loop runs here
        task.cancel()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()


def test_journal_is_compacted_every_compact_every_changes_and_replays_from_the_snapshot(
    tmp_path, monkeypatch, event_loop_of_this_thread
):
    assert coordinator.COMPACT_EVERY == 20_000  # the README's number
    monkeypatch.setattr(coordinator, "COMPACT_EVERY", 5)
    path = tmp_path / "journal.jsonl"
    source = _table_source()
    live = _coordinator(path, source, False, monkeypatch)
    commands = [
        cmd.Register(0, 2, 0, 2, 1.0),
        cmd.Register(1, 2, 1, 2, 1.0),
        cmd.StartEpoch(0, 0),
        cmd.Lease(0, 0, count=2, time=2.0, request="a"),
    ]
    for command in commands:
        live._do(command)
    assert _ops(path) == ["header", "register", "register", "epoch", "lease"]  # 4 < 5

    leased = live._do(cmd.Lease(1, 0, count=3, time=3.0, request="b"))  # the 5th change
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["op"] for e in lines] == ["header", "snapshot"]
    assert lines[0]["version"] == JOURNAL_VERSION
    assert lines[1]["state"] == _json(live._core.to_dict())

    ids = tuple(tuple(p) for p in leased.pieces)
    live._do(cmd.Ack(1, 0, 1, ids, 4.0))  # journaled after the snapshot
    assert _ops(path) == ["header", "snapshot", "ack"]
    expected = _json(live._core.to_dict())
    assert expected["consumed"] == [[0, sorted(list(p) for p in ids)]]

    # A restarted coordinator (the old process is gone): the snapshot, then the change
    # after it.
    live._journal._handle.close()
    again = _coordinator(path, source, True, monkeypatch)
    state = _json(again._core.to_dict())
    assert state["events"][-1]["event"] == "coordinator_restarted"
    state["events"] = state["events"][:-1]
    assert state == expected

    # The restarted coordinator compacts again within COMPACT_EVERY changes of its own.
    for i in range(5):
        again._do(cmd.Lease(i % 2, 0, count=1, time=5.0 + i, request=f"c{i}"))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["op"] for e in lines] == ["header", "snapshot"]
    assert lines[1]["state"] == _json(again._core.to_dict())


# -- journal format (README: "A journal ... of an older format ... is refused") ------------
@pytest.mark.parametrize("old", [{"version": JOURNAL_VERSION - 1}, {}])
def test_journal_of_an_older_format_is_refused_naming_it(tmp_path, old):
    path = tmp_path / "old.jsonl"
    header = {"op": "header", "loader": "readme-old", **old}
    path.write_text(json.dumps(header) + "\n" + json.dumps({"op": "register", "args": {}}) + "\n")
    journal = Journal(str(path), "readme-old")
    shown = re.escape(repr(old.get("version")))
    message = rf"journal {re.escape(str(path))} has version {shown}, this rayshard writes version"
    with pytest.raises(ConfigError, match=message):
        journal.check_reusable()  # the driver, before the coordinator starts
    with pytest.raises(ConfigError, match=message):
        journal.replay()  # a restarted coordinator
    with pytest.raises(ConfigError, match=message):
        journal.start_fresh()  # a first start over it


# -- retries of remote I/O (README: "6 attempts, about 8 s of outage") ---------------------
@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The back-off waits of `with_retries`, recorded instead of slept. Only the cache
    module's `time` is replaced: other threads of this process (Ray's) keep sleeping."""
    waited: list[float] = []
    monkeypatch.setattr(cache, "time", types.SimpleNamespace(sleep=waited.append))
    return waited


def _failing(times: int, error: Exception):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "read"

    return call, calls


WAITS = [0.25, 0.5, 1.0, 2.0, 4.0]


@pytest.mark.parametrize("failures", range(6))
@pytest.mark.parametrize("error", [OSError("connection reset"), pa.ArrowIOError("timeout")])
def test_remote_io_is_retried_with_doubling_waits(sleeps, failures, error):
    call, calls = _failing(failures, error)
    assert cache.with_retries(call, remote=True) == "read"
    assert len(calls) == failures + 1
    assert sleeps == WAITS[:failures]


def test_remote_io_gives_up_at_the_sixth_failure_after_about_8_s(sleeps):
    assert cache.READ_ATTEMPTS == 6 and cache.FIRST_BACKOFF_S == 0.25
    call, calls = _failing(6, OSError("connection reset"))
    with pytest.raises(OSError, match="connection reset"):
        cache.with_retries(call, remote=True)
    assert len(calls) == 6
    assert sleeps == WAITS and sum(sleeps) == 7.75


def test_local_io_is_not_retried(sleeps):
    call, calls = _failing(1, OSError("disk"))
    with pytest.raises(OSError):
        cache.with_retries(call, remote=False)
    assert len(calls) == 1 and sleeps == []


class _FlakyStore(pafs.FSSpecHandler):
    """A store (fsspec's local files behind `pyarrow.fs.PyFileSystem`, so remote to
    rayshard) whose next `failures` openings fail with `error`."""

    def __init__(self) -> None:
        super().__init__(fsspec.filesystem("file"))
        self.failures = 0
        self.error: Exception = OSError("connection reset by peer")
        self.opened: list[str] = []

    def open_input_file(self, path):
        self.opened.append(path)
        if self.failures:
            self.failures -= 1
            raise self.error
        return super().open_input_file(path)


def _parquet_files(folder: Path, sizes: list[int]) -> None:
    folder.mkdir()
    start = 0
    for index, rows in enumerate(sizes):
        table = pa.table({"id": pa.array(range(start, start + rows), pa.int64())})
        pq.write_table(table, folder / f"part-{index}.parquet")
        start += rows


@pytest.fixture
def flaky(tmp_path) -> tuple[ParquetSource, _FlakyStore]:
    _parquet_files(tmp_path / "data", [10, 10])
    store = _FlakyStore()
    source = ParquetSource(str(tmp_path / "data"), filesystem=pafs.PyFileSystem(store))
    store.opened.clear()
    return source, store


def _ids(batches) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


def test_a_remote_source_rides_through_five_failures(flaky, sleeps):
    source, store = flaky
    store.failures = 5
    assert _ids(source.read(0, 20)) == list(range(20))
    assert len(store.opened) == 5 + 1 + 1  # six tries of file 0, one of file 1
    assert sleeps == WAITS


def test_a_remote_source_gives_up_at_six_failures_with_a_data_error(flaky, sleeps):
    source, store = flaky
    store.failures = 6
    with pytest.raises(DataError, match=r"part-0\.parquet: cannot open the file any more"):
        list(source.read(0, 20))
    assert len(store.opened) == 6
    assert sleeps == WAITS


# -- refused reads (README: "a local PermissionError ... ReadDeniedError ... not retried") --
def test_a_local_permission_error_is_a_read_denied_error_naming_the_file(
    tmp_path, monkeypatch, sleeps
):
    _parquet_files(tmp_path / "data", [10, 10])
    source = ParquetSource(str(tmp_path / "data"))
    denied = str(tmp_path / "data" / "part-1.parquet")
    real_open = ParquetSource._open
    opened: list[str] = []

    def open_as_a_stranger(self, fs, path):
        # What pyarrow raises for a local file the process may not read (the tests run as
        # root, whom file modes do not stop).
        assert isinstance(fs, pafs.LocalFileSystem)
        opened.append(path)
        if path == denied:
            raise PermissionError(13, "Permission denied", path)
        return real_open(self, fs, path)

    monkeypatch.setattr(ParquetSource, "_open", open_as_a_stranger)
    got: list[int] = []
    with pytest.raises(ReadDeniedError) as info:
        for batch in source.read(0, 20):
            got += _ids([batch])
    assert isinstance(info.value, DataError)
    message = str(info.value)
    assert message.startswith(f"{denied}: the store denied opening it")
    assert "not retried" in message and "read access" in message
    assert got == list(range(10))  # the rows before it were delivered
    assert opened.count(denied) == 1 and sleeps == []


def test_a_store_refusal_is_a_read_denied_error_without_retries(flaky, sleeps):
    source, store = flaky
    store.failures = 1
    store.error = PermissionError(13, "Permission denied", "part-0.parquet")
    with pytest.raises(ReadDeniedError, match=r"part-0\.parquet: the store denied opening it"):
        list(source.read(0, 20))
    assert len(store.opened) == 1 and sleeps == []


# -- mixing (README: "an epoch holds at most 3e9 samples") ---------------------------------
def test_a_mixed_epoch_holds_at_most_3e9_samples():
    assert MAX_EPOCH_SAMPLES == 3_000_000_000
    sources = [_table_source(100), _table_source(50)]
    big = 10**9  # positions per split: a few layout entries, however large the epoch
    most = MixedSource(sources, [0.5, 0.5], samples_per_epoch=MAX_EPOCH_SAMPLES, split_rows=big)
    assert sum(most.counts) == MAX_EPOCH_SAMPLES
    assert most.layout().num_samples == MAX_EPOCH_SAMPLES
    with pytest.raises(ConfigError, match=r"mixed epoch of 3000000001 samples is out of range"):
        MixedSource(sources, [0.5, 0.5], samples_per_epoch=MAX_EPOCH_SAMPLES + 1, split_rows=big)
    with pytest.raises(
        ConfigError,
        match=r"3000000001 samples is out of range: it must hold between 1 and 3000000000",
    ):
        MixedSource(sources, counts=[MAX_EPOCH_SAMPLES, 1], split_rows=big)


# -- configuration defaults (README: "The keys (defaults in brackets)") --------------------
def _readme_defaults() -> dict[str, str]:
    """key -> the text in brackets after it, in the README's list of keys."""
    text = README.read_text()
    section = text.split("The keys (defaults in brackets):")[1].split("Only `transform=`")[0]
    section = " ".join(section.split())
    # `key` [default], or `key` (alias `other`) [default]; a key without brackets has none
    found = re.findall(r"`(\w+)`(?: \(alias `\w+`\))? \[([^\]]*)\]", section)
    return dict(found)


# Keys whose default is None, which the README describes by what it resolves to.
DESCRIBED = {
    "total_shards": "one per data-parallel rank",
    "expected_world_size": "unset",
    "split_rows": "unset",
    "columns": "all",
    "fill_null": "none",
    "reader_threads": "the reading process's CPUs, 1-8",
    "packing": "none",
    "namespace": "one per Ray job",
    "batches_per_object": "16 static, 4 dynamic",
    "straggler_timeout_s": "off",
    "dp_groups": "consecutive",
    "transform_resources": "reader's node",
    "consumer_reads": "when the rank has one consumer, no worker processes, no transform, "
    "no packing and `reader_num_cpus` 0",
    "journal_path": "a local temp file",
}


def _literal(text: str):
    """A README default as a value: a number, a yes/no, a size or a choice (a string)."""
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*", text):
        return float(text)
    size = re.fullmatch(r"(\d+) MiB", text)
    if size:
        return int(size.group(1)) << 20
    return text


def test_readme_defaults_are_the_dataclass_defaults():
    documented = _readme_defaults()
    fields = {f.name: f for part in PARTS.values() for f in dataclasses.fields(part)}
    assert set(documented) <= set(fields), set(documented) - set(fields)
    # Only `paths` and `padding` go without a default in brackets (both None: not given).
    assert set(fields) - set(documented) == {"paths", "padding"}
    assert fields["paths"].default is None and fields["padding"].default is None
    wrong = {}
    for key, text in documented.items():
        default = fields[key].default
        if key in DESCRIBED:
            if default is not None or text != DESCRIBED[key]:
                wrong[key] = (text, default)
            continue
        value = default.value if isinstance(default, Enum) else default
        expected = _literal(text)
        if value != expected or (type(value) is bool) != (type(expected) is bool):
            wrong[key] = (text, default)
    assert not wrong, f"README default [text] vs dataclass default: {wrong}"


def test_readme_described_defaults_resolve_as_described():
    # batches_per_object [16 static, 4 dynamic]
    assert LoaderConfig().block_batches == 16
    assert LoaderConfig(policy="file").block_batches == 16
    assert LoaderConfig(policy="dynamic").block_batches == 4


@pytest.mark.parametrize(
    ("claim", "constant"),
    [
        (r"Only footers are read up front, (\d+) files at a time", "FOOTER_THREADS"),
        (r"keeps the Parquet files it read open \(up to (\d+)\)", "OPEN_FILES_CACHE"),
        (r"takes its watches over after (\d+) s \(doubling", "RETRY_S"),
        (r"\(doubling, up to (\d+) s,", "MAX_RETRY_S"),
        (r"does not answer within (\d+) s", "SEES_TIMEOUT_S"),
    ],
)
def test_readme_numbers_are_the_constants_the_code_uses(claim, constant):
    from rayshard.runtime import node_watch
    from rayshard.sources import _catalog, _open_files

    found = re.search(claim, " ".join(README.read_text().split()))
    assert found, f"README no longer says {claim!r}"
    modules = (_catalog, _open_files, node_watch)
    value = next(getattr(m, constant) for m in modules if hasattr(m, constant))
    assert float(found.group(1)) == value, (constant, value)


def test_readme_states_the_acknowledgement_pacing_the_coordinator_uses():
    from rayshard.core.ack_pacing import AckPacing

    text = " ".join(README.read_text().split())
    pacing = AckPacing(0.1)
    found = re.search(r"`consumers x CPU per call / ([\d.]+)`", text)
    assert found and float(found.group(1)) == pacing.utilization
    assert f"more than {pacing.utilization:.0%} of a core" in text
    found = re.search(r"its first window \((\d+) s and (\d+) calls\)", text)
    assert found, "README no longer states the first measurement window"
    assert (float(found.group(1)), int(found.group(2))) == (pacing.window_s, pacing.min_calls)
    # the straggler cap: "never more than a quarter of that timeout", "never exceeds a quarter"
    capped = AckPacing.for_settings(
        types.SimpleNamespace(ack_interval_s=0.1, straggler_timeout_s=8)
    )
    assert capped.max_interval_s == 8 / 4
    assert "never more than a quarter of that timeout" in text
    assert "never exceeds a quarter of the timeout" in text
    assert "`iterator.stats()` shows the interval" in text and "`ack_interval_asked_s`" in text


def test_readme_states_when_an_acknowledgement_relay_is_ended():
    from rayshard.config.parts import RELAY_MODES, RuntimeConfig
    from rayshard.core.ack_pacing import AckAnswer, AckPacing
    from rayshard.runtime import ack_relay

    text = " ".join(README.read_text().split())
    found = re.search(
        r"owned by the coordinator, ended after (\d+) s unused, or (\w+) of the intervals", text
    )
    assert found and float(found.group(1)) == ack_relay.IDLE_RELEASE_S
    relays = ack_relay.AckRelays(AckPacing(0.1))
    relays.forwarded("node", "token", [("ack", (), {})] * 2, [AckAnswer(20.0), None])
    assert relays.idle_limit_s() == {"four": 4}[found.group(2)] * 20.0
    assert RuntimeConfig().ack_relay == "auto" and '`ack_relay="auto"` (the default)' in text
    for mode in RELAY_MODES:
        assert f'`ack_relay="{mode}"`' in text, mode
    from rayshard.runtime.relay_link import PROBE_S, RELAY_PATIENCE_S, RELAY_START_S

    found = re.search(r"did not answer within (\d+) s, nor a probe within (\d+) s: a", text)
    assert found and float(found.group(1)) == RELAY_PATIENCE_S
    assert float(found.group(2)) == PROBE_S
    found = re.search(r"one not running within (\d+) s is asked for again", text)
    assert found and float(found.group(1)) == RELAY_START_S
    assert RELAY_START_S < ack_relay.IDLE_RELEASE_S  # (the idle release would end it first)
