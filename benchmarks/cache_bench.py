"""Benchmark of the local disk cache of remote files: a rayshard Loader over Parquet on a
real S3 server (moto's server mode on 127.0.0.1), without and with `cache_dir`.

    python -m benchmarks.cache_bench [--rows N] [--epochs E] [--out DIR]

The dataset (`id` int64, `x` fixed_size_list<float32>[64]; 8 files, row groups of 10,000
rows) is uploaded to a bucket of a moto S3 server run in its own process (so that it does
not share the driver's GIL), then read by a `Loader(ParquetSource(..., filesystem=S3))`
with 2 ranks (2 iterators consumed by 2 threads of the driver, batch_format="numpy",
batch 1024) for E epochs (default 3): once without a cache, then with `cache_dir` (a temp
folder). Each configuration uses one loader; its first epoch includes the readers'
start-up. After the cached epochs the server is stopped and one more cached epoch is read:
it must complete and cover every row exactly once.

Bytes fetched from the store are counted on the server side: a WSGI wrapper around moto's
application in the server process adds up the response body bytes of every GET of an
object (range reads included) and counts the requests; they are read between epochs (the
epochs are separated: both ranks finish one before either asks for the next). Next to
them: the expected bytes of an uncached epoch (the compressed sizes of the column chunks
of every row group, from the Parquet metadata; footers come on top), and the cache
folder's files and bytes after each epoch (partial downloads excluded).

Timing: epoch seconds from the first rank's `iter()` to the last rank's last batch.
The ratio is the mean of epochs 2..E with the cache over the same without it, from this
run (the machine is shared: compare ratios, not absolute numbers).

moto is not S3: it answers every GET, range reads included, by reading and copying the
whole object (objects over about 5 MB live in a temporary file), so an uncached epoch
costs about GETs x object size inside the server and grows faster than the data (objects
of 16 MB: warm uncached epochs ~0.7 s; objects of 41 MB: ~13 s). The ratio therefore
depends on the object size here, and says little about a real object store's latency.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from benchmarks._measure import MB, EpochTimer, format_table, summarize_epoch
from benchmarks._report import ROOT, start_local_ray, write_json

BUCKET = "rayshard-cache-bench"
PREFIX = f"{BUCKET}/data"
FEATURES = 64
ROW_BYTES = FEATURES * 4 + 8  # one row as numpy: x, id
BATCH_SIZE = 1024
WORLD = 2
FILES = 8
ROW_GROUP = 10_000
DEFAULT_OUT = ROOT / "benchmarks" / "results"
KEYS = {"access_key": "testing", "secret_key": "testing"}

# Counters shared with the server process: object GETs, their body bytes, other requests.
GETS, GET_BYTES, OTHER = range(3)


# ----------------------------------------------------------------------------- server


class _Counting:
    """WSGI wrapper: counts object GETs (path /bucket/key) and the body bytes sent back."""

    def __init__(self, app, counters) -> None:
        self.app, self.counters = app, counters

    def __call__(self, environ, start_response):
        parts = [p for p in environ.get("PATH_INFO", "").split("/") if p]
        is_object_get = environ.get("REQUEST_METHOD") == "GET" and len(parts) >= 2
        body = self.app(environ, start_response)
        if not is_object_get:
            with self.counters.get_lock():
                self.counters[OTHER] += 1
            return body
        return self._counted(body)

    def _counted(self, body):
        sent = 0
        try:
            for chunk in body:
                sent += len(chunk)
                yield chunk
        finally:
            if hasattr(body, "close"):
                body.close()
            with self.counters.get_lock():
                self.counters[GETS] += 1
                self.counters[GET_BYTES] += sent


def _serve(port: int, counters, ready) -> None:
    """The server process: moto's S3 (all services) on 127.0.0.1:port, counted."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    app = _Counting(DomainDispatcherApplication(create_backend_app), counters)
    server = make_server("127.0.0.1", port, app, True, request_handler=MotoRequestHandler)
    ready.set()
    server.serve_forever()


class S3Server:
    """moto's S3 server in a spawned process; `counters()` reads what it served."""

    def __init__(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.endpoint = f"127.0.0.1:{self.port}"
        context = mp.get_context("spawn")
        self._counters = context.Array("q", 3)
        self._ready = context.Event()
        self._process = context.Process(
            target=_serve, args=(self.port, self._counters, self._ready), daemon=True
        )

    def start(self) -> None:
        self._process.start()
        if not self._ready.wait(60):
            raise RuntimeError("moto's S3 server did not start within 60 s")
        deadline = time.time() + 30
        while True:  # listening once a connection is accepted
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(30)

    def counters(self) -> dict[str, int]:
        with self._counters.get_lock():
            values = list(self._counters)
        return {"gets": values[GETS], "get_bytes": values[GET_BYTES], "other": values[OTHER]}

    def filesystem(self, **options) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            endpoint_override=self.endpoint, scheme="http", region="us-east-1", **KEYS, **options
        )


def upload(fs: pafs.S3FileSystem, rows: int, files: int, row_group: int) -> dict:
    """Write the dataset into the bucket; sizes of the objects and of their row groups."""
    fs.create_dir(BUCKET)
    rng = np.random.default_rng(0)
    bounds = np.linspace(0, rows, files + 1).astype(np.int64)
    object_bytes = chunk_bytes = 0
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        x = rng.standard_normal((hi - lo) * FEATURES, dtype=np.float32)
        table = pa.table(
            {
                "id": np.arange(lo, hi, dtype=np.int64),
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x), FEATURES),
            }
        )
        path = f"{PREFIX}/part-{index:03d}.parquet"
        pq.write_table(table, path, filesystem=fs, row_group_size=row_group)
        object_bytes += fs.get_file_info(path).size
        meta = pq.ParquetFile(path, filesystem=fs).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            chunk_bytes += sum(
                group.column(c).total_compressed_size for c in range(group.num_columns)
            )
    return {"object_bytes": object_bytes, "row_group_bytes": chunk_bytes}


# ------------------------------------------------------------------------------ epochs


def cache_contents(folder: Path | None) -> tuple[int, int]:
    """Files and bytes in the cache folder (partial downloads excluded)."""
    if folder is None or not folder.exists():
        return 0, 0
    files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    return len(files), sum(p.stat().st_size for p in files)


def _consume(iterator, rank: int, epoch: int, out: list, errors: list) -> None:
    try:
        timer = EpochTimer(rank, epoch)
        out[rank] = timer.consume(iterator, lambda b: b["id"][~b["_padded"]])
    except BaseException as error:  # noqa: BLE001 - reported with the epoch
        errors.append(f"rank {rank}: {type(error).__name__}: {error}")


def read_epoch(iterators, epoch: int, num_rows: int, timeout_s: float) -> dict:
    """One epoch: both ranks in threads of the driver, joined before the next."""
    records: list = [None] * len(iterators)
    errors: list[str] = []
    threads = [
        threading.Thread(target=_consume, args=(it, rank, epoch, records, errors), daemon=True)
        for rank, it in enumerate(iterators)
    ]
    for thread in threads:
        thread.start()
    deadline = time.time() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.time()))
    if any(t.is_alive() for t in threads):
        errors.append(f"the epoch did not finish within {timeout_s:.0f} s")
    if errors or any(r is None for r in records):
        return {"epoch": epoch, "error": "; ".join(errors) or "a rank returned nothing"}
    return summarize_epoch(records, num_rows, ROW_BYTES)


def run_config(
    label: str,
    server: S3Server,
    num_rows: int,
    epochs: int,
    cache_dir: Path | None,
    stopped_epoch: bool,
    timeout_s: float,
) -> list[dict]:
    """`epochs` epochs of one loader (and one more after stopping the server)."""
    from rayshard.loader import Loader
    from rayshard.sources.parquet import ParquetSource

    source = ParquetSource(
        PREFIX,
        filesystem=server.filesystem(connect_timeout=1),
        cache_dir=cache_dir,
    )
    loader = Loader(
        source, batch_size=BATCH_SIZE, name=f"cache-bench-{uuid.uuid4().hex[:8]}", shuffle=False
    )
    out = []
    try:
        iterators = [
            loader.iterator(world_rank=r, world_size=WORLD, batch_format="numpy")
            for r in range(WORLD)
        ]
        plan = [(e, False) for e in range(epochs)] + ([(epochs, True)] if stopped_epoch else [])
        for epoch, stop_first in plan:
            if stop_first:
                server.stop()
            before = server.counters()
            result = read_epoch(iterators, epoch, num_rows, timeout_s)
            after = server.counters()
            files, size = cache_contents(cache_dir)
            result.update(
                config=label + (", server stopped" if stop_first else ""),
                server_stopped=stop_first,
                object_gets=after["gets"] - before["gets"],
                bytes_fetched=after["get_bytes"] - before["get_bytes"],
                other_requests=after["other"] - before["other"],
                cache_files=files,
                cache_bytes=size,
            )
            result.pop("rank_rows", None)
            out.append(result)
            status = result.get("error") or f"{result['seconds']:.2f} s"
            print(f"  {result['config']} epoch {epoch + 1}: {status}", flush=True)
            if "error" in result:
                break
    finally:
        loader.shutdown()
    return out


def _mean_seconds(epochs: list[dict]) -> float | None:
    values = [e["seconds"] for e in epochs if "seconds" in e]
    return sum(values) / len(values) if values else None


TABLE = (
    ("config", "config", "s"),
    ("epoch", "epoch_no", "d"),
    ("seconds", "seconds", ".2f"),
    ("rows/s", "rows_per_s", ",.0f"),
    ("GETs", "object_gets", "d"),
    ("fetched MB", "fetched_mb", ".1f"),
    ("cache files", "cache_files", "d"),
    ("cache MB", "cache_mb", ".1f"),
    ("coverage", "coverage_text", "s"),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cache_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rows", type=int, default=400_000, help="rows to upload")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per configuration (>= 2)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the JSON")
    parser.add_argument("--ray-cpus", type=int, default=2, help="logical CPUs for ray.init")
    parser.add_argument(
        "--epoch-timeout", type=float, default=300.0, help="seconds before an epoch fails"
    )
    args = parser.parse_args(argv)
    for option, value, low in (("--rows", args.rows, FILES), ("--epochs", args.epochs, 2)):
        if value < low:
            parser.error(f"Invalid value for '{option}': {value} is not in the range x>={low}.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    begun = time.time()
    server = S3Server()
    server.start()
    workdir = Path(tempfile.mkdtemp(prefix="rayshard-cache-bench-"))
    try:
        sizes = upload(server.filesystem(allow_bucket_creation=True), args.rows, FILES, ROW_GROUP)
        print(
            f"cache bench: {args.rows:,} rows ({args.rows * ROW_BYTES / MB:,.0f} MB as numpy) "
            f"in {FILES} Parquet objects ({sizes['object_bytes'] / MB:,.1f} MB) on moto S3 at "
            f"{server.endpoint}, batch {BATCH_SIZE}, {WORLD} ranks, {args.epochs} epochs",
            flush=True,
        )
        start_local_ray(args.ray_cpus, "rayshard-cache-bench")
        no_cache = run_config(
            "no cache", server, args.rows, args.epochs, None, False, args.epoch_timeout
        )
        cached = run_config(
            "cache", server, args.rows, args.epochs, workdir / "cache", True, args.epoch_timeout
        )
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    epochs = no_cache + cached
    for e in epochs:
        e["epoch_no"] = e["epoch"] + 1
        e["fetched_mb"] = e["bytes_fetched"] / MB
        e["cache_mb"] = e["cache_bytes"] / MB
        e["coverage_text"] = (
            "ok" if e.get("coverage", {}).get("ok") else f"FAILED {e.get('error', '')}".strip()
        )
    print(format_table(epochs, TABLE))

    warm_plain = _mean_seconds(no_cache[1:])
    warm_cached = _mean_seconds([e for e in cached[1:] if not e["server_stopped"]])
    ratio = warm_cached / warm_plain if warm_plain and warm_cached else None
    stopped = [e for e in cached if e["server_stopped"]]
    stopped_ok = bool(stopped) and stopped[0].get("coverage", {}).get("ok", False)
    later_cached = cached[1:]
    checks = {
        "all_epochs_cover_exactly": all(e.get("coverage", {}).get("ok") for e in epochs),
        "cached_later_epochs_fetch_nothing": bool(later_cached)
        and all(e["bytes_fetched"] == 0 for e in later_cached),
        "first_cached_epoch_fetches_every_object_once": bool(cached)
        and cached[0]["bytes_fetched"] == sizes["object_bytes"]
        and cached[0]["cache_bytes"] == sizes["object_bytes"],
        "server_stopped_epoch_completes": stopped_ok,
    }
    print(
        f"epochs 2..{args.epochs}: mean {warm_plain or float('nan'):.2f} s without cache, "
        f"{warm_cached or float('nan'):.2f} s with it: cached / uncached = "
        f"{ratio if ratio is not None else float('nan'):.2f}"
    )
    print(
        f"bytes per uncached epoch, expected: {sizes['row_group_bytes'] / MB:.1f} MB of row "
        f"groups (+ footers); objects: {sizes['object_bytes'] / MB:.1f} MB"
    )
    for key, ok in checks.items():
        print(f"{key}: {'yes' if ok else 'NO'}")
    report = {
        "config": {
            "rows": args.rows,
            "files": FILES,
            "row_group_rows": ROW_GROUP,
            "features": FEATURES,
            "row_bytes": ROW_BYTES,
            "batch_size": BATCH_SIZE,
            "world_size": WORLD,
            "epochs": args.epochs,
            "ray_cpus": args.ray_cpus,
            "store": "moto S3 server (own process) on 127.0.0.1",
        },
        "sizes": sizes,
        "epochs": epochs,
        "warm_epoch_s": {"no_cache": warm_plain, "cache": warm_cached},
        "cache_vs_no_cache_warm_time": ratio,
        "checks": checks,
        "total_s": time.time() - begun,
    }
    write_json(args.out / "cache_bench.json", report)
    import ray

    if ray.is_initialized():
        ray.shutdown()
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main"]
