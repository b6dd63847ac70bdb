"""Object storage as a tested path: a real S3 server (moto's server mode) on 127.0.0.1,
started by the test, read through `pyarrow.fs.S3FileSystem` by real loaders.

Credentials from the environment, a missing bucket, a missing object, an `s3://` URI with
`filesystem=`, a server stopped and restarted mid-epoch (reads retry with a bound and
nothing is lost), a read the store denies (moto's IAM enforcement: a clear error naming
the file, not retried, rows delivered before it kept), and the local cache: the second
epoch is read from local disk and completes with the server stopped; eviction keeps the
folder under its limit."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import threading
import urllib.request
from collections import Counter

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from rayshard.errors import ConfigError, DataError, ReadDeniedError
from rayshard.plan import intervals as iv
from rayshard.sources.cache import FileCache, with_retries
from rayshard.sources.parquet import ParquetSource
from tests.runtime.helpers import real_ids, unique_name

moto_server = pytest.importorskip("moto.server", reason="the S3 tests need moto[server]")

BUCKET = "rayshard-data"
SIZES = [40, 35, 45]  # 120 rows in three objects, row groups of 10
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class S3Server:
    """moto's S3 server on 127.0.0.1; stop() and start() keep its buckets (same process)."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self._server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port)
        self._keys: dict[str, tuple[str, str]] = {}

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()

    def enforce_permissions(self, on: bool) -> None:
        """moto checks every request against its IAM users' policies from now on (`on`),
        or accepts any credentials again (its default)."""
        request = urllib.request.Request(
            f"http://{self.endpoint}/moto-api/reset-auth",
            data=b"0" if on else b"inf",
            headers={"Content-Type": "text/plain"},  # not a form: moto reads the raw body
        )
        with urllib.request.urlopen(request) as reply:
            assert json.load(reply)["status"] == "ok"

    def iam_user(self, name: str, statements: list, keys=KEYS) -> tuple[str, str]:
        """An IAM user with an inline policy of `statements`; returns its access key pair."""
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=f"http://{self.endpoint}",
            region_name="us-east-1",
            aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        )
        if name not in [u["UserName"] for u in iam.list_users()["Users"]]:
            iam.create_user(UserName=name)
            key = iam.create_access_key(UserName=name)["AccessKey"]
            self._keys[name] = (key["AccessKeyId"], key["SecretAccessKey"])
        policy = {"Version": "2012-10-17", "Statement": statements}
        iam.put_user_policy(UserName=name, PolicyName=name, PolicyDocument=json.dumps(policy))
        return self._keys[name]

    def filesystem(self, **options) -> pafs.S3FileSystem:
        options.setdefault("access_key", KEYS["AWS_ACCESS_KEY_ID"])
        options.setdefault("secret_key", KEYS["AWS_SECRET_ACCESS_KEY"])
        return pafs.S3FileSystem(
            endpoint_override=self.endpoint, scheme="http", region="us-east-1", **options
        )


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    server.start()
    fs = server.filesystem(allow_bucket_creation=True)
    fs.create_dir(BUCKET)
    start = 0
    for index, rows in enumerate(SIZES):
        table = pa.table({"id": pa.array(range(start, start + rows), pa.int64())})
        pq.write_table(
            table, f"{BUCKET}/train/part-{index}.parquet", filesystem=fs, row_group_size=10
        )
        start += rows
    yield server
    server.stop()


def _epoch_ids(loader, world: int = 2) -> list[int]:
    iterators = [
        loader.iterator(world_rank=r, world_size=world, batch_format="numpy") for r in range(world)
    ]
    return [i for it in iterators for i in real_ids(list(it))]


def test_credentials_from_the_environment(s3, monkeypatch):
    for key, value in KEYS.items():
        monkeypatch.setenv(key, value)
    fs = pafs.S3FileSystem(endpoint_override=s3.endpoint, scheme="http", region="us-east-1")
    source = ParquetSource(f"{BUCKET}/train", filesystem=fs)
    assert source.layout().num_samples == sum(SIZES)
    ids = [i for b in source.read(0, sum(SIZES)) for i in b.column("id").to_pylist()]
    assert ids == list(range(sum(SIZES)))


def test_s3_uri_with_filesystem_is_handled_and_another_scheme_is_explained(s3):
    source = ParquetSource(f"s3://{BUCKET}/train", filesystem=s3.filesystem())
    assert source.layout().num_samples == sum(SIZES)
    with pytest.raises(ConfigError, match=r"gs:// path with filesystem=S3FileSystem"):
        ParquetSource(f"gs://{BUCKET}/train", filesystem=s3.filesystem())


def test_missing_bucket_and_missing_object_are_clear_errors(s3):
    with pytest.raises(ConfigError, match=r"no-such-bucket/train: no such file or folder"):
        ParquetSource("no-such-bucket/train", filesystem=s3.filesystem())
    with pytest.raises(ConfigError, match=r"train/part-9.parquet: no such file or folder"):
        ParquetSource(f"{BUCKET}/train/part-9.parquet", filesystem=s3.filesystem())


def test_server_restarted_mid_epoch_reads_retry_and_nothing_is_lost(ray_session, s3):
    """The server goes away after the first batches and comes back a moment later: the
    reads retry (bounded: about 8 s of outage) and the epoch is exact; so is the next one
    (a loader over S3 covers every epoch exactly; over 2 ranks: the cache test)."""
    from rayshard.loader import Loader

    loader = Loader(
        ParquetSource(f"{BUCKET}/train", filesystem=s3.filesystem(connect_timeout=1)),
        batch_size=4,
        name=unique_name("s3-outage"),
        prefetch_depth=1,
        batches_per_object=1,
    )
    it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
    gen = iter(it)
    ids = real_ids([next(gen)])
    s3.stop()
    restarted = threading.Timer(1.0, s3.start)  # the outage, not an assertion on time
    restarted.start()
    try:
        ids += real_ids(list(gen))
    finally:
        restarted.join()
    assert Counter(ids) == Counter(range(sum(SIZES)))
    assert Counter(real_ids(list(it))) == Counter(range(sum(SIZES)))  # the next epoch
    loader.shutdown()


def test_opening_a_file_during_an_outage_retries(s3):
    """A read during an outage (the server comes back a moment later) reopens its file:
    the opening is retried like the read, not refused as unreadable."""
    import numpy as np

    fs = s3.filesystem()
    rows = 4000  # 1 MB of random payload: far more than pyarrow reads with the footer
    payload = np.random.default_rng(0).integers(0, 2**62, size=(rows, 32))
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(payload.ravel()), 32),
        }
    )
    pq.write_table(table, f"{BUCKET}/big/part-0.parquet", filesystem=fs, row_group_size=500)
    source = ParquetSource(
        f"{BUCKET}/big", filesystem=s3.filesystem(connect_timeout=1), columns=["id"]
    )
    last = rows
    s3.stop()
    restarted = threading.Timer(1.0, s3.start)  # the outage, not an assertion on time
    restarted.start()
    try:
        rows = pa.Table.from_batches(list(source.read(last - 5, last)))
    finally:
        restarted.join()
    assert rows["id"].to_pylist() == list(range(last - 5, last))


_HELD_PROBE = """
import gc, sys, pyarrow as pa, pyarrow.fs as pafs
import rayshard.sources._open_files as files
from rayshard.sources.parquet import ParquetSource
endpoint, folder, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
files.OPEN_FILES_BUFFERED = budget
fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-east-1",
                       access_key="testing", secret_key="testing")
source = ParquetSource(folder, filesystem=fs)
rows = sum(batch.num_rows for batch in source.read(0, source.layout().num_samples))
gc.collect()
opened, open_held = source.stats()["files_opened"], pa.total_allocated_bytes()
del source
gc.collect()
print(rows, opened, open_held - pa.total_allocated_bytes())
"""


def test_open_remote_files_keep_a_bounded_number_of_row_groups(s3):
    """A remote Parquet file is pre-buffered (one request per row group), so an open
    handle keeps its last row group as stored until its next read; a process's open
    remote files together keep at most `OPEN_FILES_BUFFERED` bytes (each reading thread's
    latest file spared). Read in a process of its own: Arrow's counter is process-wide."""
    import subprocess
    import sys

    import numpy as np

    fs = s3.filesystem()
    rng = np.random.default_rng(0)
    files, rows = 12, 4096
    stored = 0
    for i in range(files):
        x = pa.array(rng.standard_normal(rows * 64, dtype=np.float32))
        table = pa.table({"x": pa.FixedSizeListArray.from_arrays(x, 64)})
        path = f"{BUCKET}/held/part-{i:02d}.parquet"
        pq.write_table(table, path, filesystem=fs, row_group_size=rows)
        with fs.open_input_file(path) as handle:
            group = pq.ParquetFile(handle).metadata.row_group(0)
            stored += sum(group.column(c).total_compressed_size for c in range(group.num_columns))

    def held(budget: int) -> int:
        args = [s3.endpoint, f"{BUCKET}/held", str(budget)]
        done = subprocess.run(
            [sys.executable, "-c", _HELD_PROBE, *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        read, opened, kept = map(int, done.stdout.split())
        assert read == files * rows
        assert opened == files  # read in order: no file opened twice
        return kept

    group = stored // files
    unbounded = held(1 << 40)  # every open file keeps its row group
    assert unbounded > stored * 0.9, (unbounded, stored)
    bounded = held(4 * group)
    assert bounded <= 4.5 * group, (bounded, group)
    latest_only = held(0)  # the reading thread's file is spared
    assert 0.5 * group < latest_only <= 1.5 * group, (latest_only, group)


def test_a_threads_latest_remote_file_stays_open_under_a_zero_budget(s3, monkeypatch):
    """Two threads taking turns on two files keep one handle each: the byte bound never
    closes a thread's latest file, so reading on in it opens nothing again."""
    import rayshard.sources._open_files as files

    monkeypatch.setattr(files, "OPEN_FILES_BUFFERED", 0)
    source = ParquetSource(f"{BUCKET}/train", filesystem=s3.filesystem())
    turns = [threading.Event() for _ in range(7)]
    turns[0].set()

    def read(first_turn: int, start: int) -> list[int]:
        ids = []
        for k, turn in enumerate(range(first_turn, 6, 2)):
            turns[turn].wait()
            batch = next(source.read(start + 10 * k, start + 10 * k + 10))
            ids += batch.column("id").to_pylist()
            turns[turn + 1].set()
        return ids

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(read, 0, 0)  # file 0's rows 0-29
        second = pool.submit(read, 1, 40)  # file 1's rows 40-69
        assert first.result() == list(range(30)) and second.result() == list(range(40, 70))
    assert source.stats()["files_opened"] == 2


def test_cache_second_epoch_reads_locally_with_the_server_stopped(ray_session, s3, tmp_path):
    from rayshard.loader import Loader

    cache = tmp_path / "cache"
    loader = Loader(
        ParquetSource(f"s3://{BUCKET}/train", filesystem=s3.filesystem(), cache_dir=cache),
        batch_size=8,
        name=unique_name("s3-cache"),
    )
    assert Counter(_epoch_ids(loader)) == Counter(range(sum(SIZES)))  # 2 ranks
    cached = sorted(p for p in os.listdir(cache) if not p.startswith("."))
    assert len(cached) == len(SIZES), cached  # whole files, no partial file left visible
    s3.stop()
    try:
        assert Counter(_epoch_ids(loader)) == Counter(range(sum(SIZES)))
    finally:
        s3.start()
    loader.shutdown()


def test_cache_never_serves_an_older_copy_of_a_rewritten_file(s3, tmp_path):
    """A cached copy belongs to the file's size and modification time when the source was
    made: a source made after the file was rewritten downloads the new one; a source made
    before reads nothing stale (a `DataError` naming the file)."""
    fs = s3.filesystem()
    path = f"{BUCKET}/rewritten/part-0.parquet"
    pq.write_table(pa.table({"x": pa.array([1, 2, 3], pa.int64())}), path, filesystem=fs)
    cache = tmp_path / "cache"

    def source() -> ParquetSource:
        return ParquetSource(f"{BUCKET}/rewritten", filesystem=s3.filesystem(), cache_dir=cache)

    first = source()
    assert pa.Table.from_batches(first.read(0, 3))["x"].to_pylist() == [1, 2, 3]
    before = source()  # made before the rewrite, reads after it
    pq.write_table(pa.table({"x": pa.array([7, 8, 9, 10, 11], pa.int64())}), path, filesystem=fs)
    after = source()
    assert after.layout().num_samples == 5
    assert pa.Table.from_batches(after.read(0, 5))["x"].to_pylist() == [7, 8, 9, 10, 11]
    assert after.cache_stats()["downloads"] == 1 and after.cache_stats()["hits"] == 0
    for copy in cache.iterdir():  # no copy left: `before` downloads the new file
        copy.unlink()
    with pytest.raises(DataError, match=r"part-0\.parquet: the store holds \d+ bytes of it"):
        list(before.read(0, 3))


def test_cache_evicts_least_recently_used_and_counts_bytes(s3, tmp_path):
    fs = s3.filesystem()
    paths = [f"{BUCKET}/train/part-{i}.parquet" for i in range(len(SIZES))]
    sizes = [fs.get_file_info(p).size for p in paths]
    cache = FileCache(tmp_path / "small", cache_limit=sizes[0] + max(sizes[1:]) + 1)
    first = cache.local_path(fs, paths[0])
    cache.local_path(fs, paths[1])
    cache.local_path(fs, paths[0])  # a hit: paths[0] is now the most recently used
    os.utime(first, (os.path.getatime(first), os.path.getmtime(first) + 10))
    cache.local_path(fs, paths[2])  # over the limit: the least recently used goes
    names = os.listdir(tmp_path / "small")
    assert len(names) == 2 and not any(n.endswith("part-1.parquet") for n in names)
    assert cache.stats["downloads"] == 3 and cache.stats["hits"] == 1
    assert cache.stats["bytes_fetched"] == sum(sizes) and cache.stats["evictions"] == 1
    with pytest.raises(ConfigError, match="cache_limit=0"):
        FileCache(tmp_path / "bad", cache_limit=0)


def test_threads_asking_for_one_file_at_once_download_it_once(s3, tmp_path):
    # A rank's reading threads read several row groups of one file at once.
    fs = s3.filesystem()
    path = f"{BUCKET}/train/part-0.parquet"
    cache = FileCache(tmp_path / "shared", cache_limit=1 << 30)
    start = threading.Barrier(6)

    def ask() -> str:
        start.wait()
        return cache.local_path(fs, path)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        copies = list(pool.map(lambda _: ask(), range(6)))
    assert len(set(copies)) == 1 and os.path.exists(copies[0])
    assert cache.stats["downloads"] == 1
    assert cache.stats["hits"] == 5
    assert cache.stats["bytes_fetched"] == fs.get_file_info(path).size


def test_a_denied_read_is_not_retried():
    calls = []

    def denied():
        calls.append(1)
        raise OSError("AWS Error ACCESS_DENIED during GetObject operation: Access Denied")

    with pytest.raises(OSError, match="ACCESS_DENIED"):
        with_retries(denied, remote=True)
    assert len(calls) == 1


def test_denied_read_is_a_clear_error_and_rows_before_it_stay_delivered(ray_session, s3):
    """The store starts refusing one object after the source was built (its policy
    changed): the loop gets a `ReadDeniedError` (a `DataError`) naming the object and the
    permission, at once; what it received before stays received and counted."""
    from rayshard.loader import Loader

    allow_all = {"Effect": "Allow", "Action": "*", "Resource": "*"}
    admin = s3.iam_user("rayshard-admin", [allow_all])
    reader = s3.iam_user("rayshard-reader", [allow_all])
    denied = f"{BUCKET}/train/part-2.parquet"
    s3.enforce_permissions(True)
    try:
        fs = s3.filesystem(access_key=reader[0], secret_key=reader[1])
        source = ParquetSource(f"{BUCKET}/train", filesystem=fs)  # every footer readable
        deny = {"Effect": "Deny", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{denied}"}
        keys = {"AWS_ACCESS_KEY_ID": admin[0], "AWS_SECRET_ACCESS_KEY": admin[1]}
        s3.iam_user("rayshard-reader", [allow_all, deny], keys=keys)
        loader = Loader(source, batch_size=5, name=unique_name("s3-denied"), prefetch_depth=1)
        it = loader.iterator(world_rank=0, world_size=1, batch_format="numpy")
        ids = []
        with pytest.raises(DataError) as info:
            for batch in it:
                ids += real_ids([batch])
        error = info.value
        assert isinstance(error, ReadDeniedError)
        assert "part-2.parquet" in str(error) and "denied" in str(error)
        assert "s3:GetObject" in str(error) and "not retried" in str(error)
        kept = sum(SIZES[:2])  # the first two objects, read before the denied one
        assert ids == list(range(kept))
        assert it.stats()["samples_received"] == kept
        assert iv.normalize(it.state_dict()["consumed"]) == ((0, kept),)
        loader.shutdown()
    finally:
        s3.enforce_permissions(False)


def test_read_denied_error_pickles_and_is_a_data_error():
    import pickle

    error = pickle.loads(pickle.dumps(ReadDeniedError("bucket/key: the store denied it")))
    assert isinstance(error, DataError) and str(error) == "bucket/key: the store denied it"


def test_a_list_of_remote_and_local_files_caches_only_the_remote_ones(s3, tmp_path, monkeypatch):
    """Reading a remote file prefetches the next file into the cache only if it is remote
    too: a local file is read where it is, never copied."""
    for key, value in KEYS.items():
        monkeypatch.setenv(key, value)
    local = tmp_path / "local.parquet"
    pq.write_table(pa.table({"id": pa.array(range(100, 110), pa.int64())}), local)
    remote = f"s3://{BUCKET}/train/part-0.parquet?endpoint_override={s3.endpoint}&scheme=http"
    cache = tmp_path / "cache"
    source = ParquetSource([remote, str(local)], cache_dir=cache)
    rows = source.layout().file_rows
    ids = [i for b in source.read(0, sum(rows)) for i in b.column("id").to_pylist()]
    assert ids == list(range(SIZES[0])) + list(range(100, 110))
    cached = [p for p in os.listdir(cache) if not p.startswith(".")]
    assert len(cached) == 1 and cached[0].endswith("part-0.parquet"), cached
    assert source.cache_stats()["downloads"] == 1
