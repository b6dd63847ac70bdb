"""The coordinator's journal: JSON lines it writes before it answers, so a restarted
coordinator can replay them and go on with the same epoch, leases and progress.

No pickle: every line is JSON. The first line names the loader; a journal of another
loader, or one corrupt before its last line, is refused. A torn last line (a crash in the
middle of a write) is dropped with a warning. `compact(state)` replaces the file, in one
atomic rename, by its header and one `snapshot` line: replay starts from there. A
coordinator holds the journal's lock (`rayshard.runtime.journal_lock`) from its start, or
its restart, to `close()`: a second live one given the same path is refused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import ray

from rayshard.core.commands import command_from_entry
from rayshard.core.state import loader_name
from rayshard.errors import ConfigError
from rayshard.runtime.journal_lock import TAKEOVER_S, JournalLock

log = logging.getLogger(__name__)
# 2: commands of rayshard.core.commands, and snapshots; 3: flat ack ids; 4: packed queues;
# 5: a shuffled `dynamic` queue in numpy's order (an epoch start replayed without a snapshot
# rebuilds its queue: by an older order its replayed leases would not be those granted);
# 6: `dynamic` queues of a file source cut by `split_rows` in row-group order (the same);
# 7: `dynamic` lease books in rank stretches with stealing (`rayshard.core.stretches`)
JOURNAL_VERSION = 7


class Journal:
    """Append-only JSON-lines file at `path` for loader `loader_id`."""

    def __init__(self, path: str, loader_id: str, *, fsync: bool = False) -> None:
        self.path = path
        self.loader_id = loader_id
        self._fsync = fsync
        self._handle: Any = None
        self._batching = False  # inside `batched()`: flushed once, at its end
        self._closed = False  # `close()`d: nothing is written any more
        self._lock = JournalLock(path)

    def check_reusable(self) -> None:
        """Refuse a file at this path that is corrupt, another loader's or held by another
        live coordinator, and a path whose folder cannot be made or written (run on the
        driver, before the coordinator starts on the same node, so the error reaches the
        user as is)."""
        if os.path.exists(self.path):
            self._read_header()
        folder = os.path.dirname(os.path.abspath(self.path))
        fix = "choose a journal_path in a folder the coordinator can write"
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as error:
            raise ConfigError(
                f"journal_path={self.path!r}: its folder cannot be made ({error}): {fix}"
            ) from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(f"journal_path={self.path!r}: its folder is not writable: {fix}")
        self._lock.check_free()

    def start_fresh(self, *, replace_any: bool = False) -> None:
        """Begin a new journal (first start of a coordinator), replacing this loader's
        journal of an earlier run; a file of another loader is refused unless
        `replace_any` (the default path, private to one job, may hold a stale file), and
        so is a path another live coordinator holds (its lock)."""
        if not replace_any:
            self.check_reusable()
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._lock.take()
        self._handle = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - kept open
        self._write({"op": "header", "version": JOURNAL_VERSION, "loader": self.loader_id})

    def open_for(self, core: Any, *, replace_any: bool) -> bool:
        """Restore `core` from this journal if Ray restarted the coordinator (returns True,
        and records the restart as an event), else start it fresh (`start_fresh`)."""
        if not actor_was_restarted():
            self.start_fresh(replace_any=replace_any)
            return False
        self.restore(core)
        core.events.append({"time": time.time(), "event": "coordinator_restarted"})
        return True

    def restore(self, core: Any) -> None:
        """Load the latest snapshot into `core` (a `CoordinatorCore`) and apply the commands
        recorded after it (a restarted coordinator), then reopen for appending."""
        for entry in self.replay():
            if entry["op"] == "snapshot":
                core.load_dict(entry["state"])
            else:
                core.apply(command_from_entry(entry))

    def close(self, *, remove: bool) -> None:
        """Write nothing more (the coordinator ends next: `Loader.shutdown`), and remove
        the file if `remove` (the default journal: it served only this loader's restarts,
        and every job would otherwise leave one in the temp folder). Its lock is let go:
        a new loader may take the path before this coordinator's process ends."""
        if self._handle is not None:
            self._handle.close()
        self._handle, self._closed = None, True
        if remove:
            for name in (self.path, f"{self.path}.compact"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(name)
        self._lock.release(remove=remove)

    def replay(self) -> Iterator[dict]:
        """The recorded entries after the header (restart), then reopen for appending: a
        torn last line is cut off first (the next entry would be glued onto it), and a
        whole last line without its newline ended. Takes the journal's lock first (its
        dead predecessor's: waits `TAKEOVER_S` for it to let go)."""
        if os.path.exists(self.path):  # (else `_entries` says it is missing)
            self._lock.take(wait_s=TAKEOVER_S)
        entries, kept = self._entries()
        with open(self.path, "r+b") as handle:
            handle.truncate(kept)
            handle.seek(kept - 1)
            if handle.read(1) != b"\n":
                handle.write(b"\n")
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        return iter(entries)

    def append(self, entry: dict) -> None:
        self._write(entry)

    def compact(self, state: dict) -> None:
        """Replace everything recorded so far by one snapshot of the state it led to."""
        if self._closed:
            return
        temporary = f"{self.path}.compact"
        with open(temporary, "w", encoding="utf-8") as handle:
            for entry in (
                {"op": "header", "version": JOURNAL_VERSION, "loader": self.loader_id},
                {"op": "snapshot", "state": state},
            ):
                handle.write(json.dumps(entry, separators=(",", ":")) + "\n")
            handle.flush()
            if self._fsync:
                os.fsync(handle.fileno())
        if self._handle is not None:
            self._handle.close()
        os.replace(temporary, self.path)
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Entries appended inside are flushed (and synced) once, at the end: commands
        answered together (a relay's groups) are written before their answers, with one
        write call rather than one each. Not nested: an inner batch's end writes all."""
        self._batching = True
        try:
            yield
        finally:
            self._batching = False
            self._flush()

    def _write(self, entry: dict) -> None:
        if self._closed:
            return
        self._handle.write(json.dumps(entry, separators=(",", ":")) + "\n")
        if not self._batching:
            self._flush()

    def _flush(self) -> None:
        if self._closed:
            return
        self._handle.flush()
        if self._fsync:
            os.fsync(self._handle.fileno())

    def _read_header(self) -> dict:
        if os.path.isdir(self.path):  # (not "corrupt ... Is a directory")
            raise ConfigError(
                f"journal_path={self.path!r} is a folder: the journal is a file; give a file "
                f"path, e.g. {os.path.join(self.path, 'journal.jsonl')!r}"
            )
        try:
            with open(self.path, encoding="utf-8") as handle:
                first = handle.readline()
            header = json.loads(first)
        except (OSError, ValueError) as error:
            raise ConfigError(
                f"journal {self.path} is corrupt (its first line is not a rayshard journal "
                f"header: {error}); delete it or pass another journal path"
            ) from error
        if not isinstance(header, dict) or header.get("op") != "header":
            raise ConfigError(
                f"journal {self.path} is not a rayshard journal: delete it or choose another path"
            )
        if header.get("version") != JOURNAL_VERSION:
            raise ConfigError(
                f"journal {self.path} has version {header.get('version')!r}, this rayshard "
                f"writes version {JOURNAL_VERSION}: delete it or choose another path"
            )
        if header.get("loader") != self.loader_id:
            same_name = loader_name(str(header.get("loader"))) == loader_name(self.loader_id)
            earlier = (
                " (a journal of this loader's earlier run, made before its files, settings "
                "or rayshard release changed, holds nothing a new run needs: delete it)"
            )
            raise ConfigError(
                f"journal {self.path} belongs to loader {header.get('loader')!r}, not to "
                f"{self.loader_id!r}: give each loader its own journal path"
                + (earlier if same_name else "")
            )
        return header

    def _entries(self) -> tuple[list[dict], int]:
        """The entries after the header, and the bytes of the file up to the last whole
        one (a torn last line, from a crash in its write, dropped with a warning)."""
        if not os.path.exists(self.path):
            raise ConfigError(
                f"journal {self.path} is missing: the coordinator cannot recover its epoch "
                "state (was it written on another node? pass a shared journal path)"
            )
        self._read_header()
        with open(self.path, "rb") as handle:
            data = handle.read()
        header, *lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        entries, kept = [], len(header) + 1
        for number, line in enumerate(lines, start=2):
            try:
                entries.append(json.loads(line))
            except ValueError as error:
                if number == len(lines) + 1:
                    log.warning("journal %s: dropping a torn last line", self.path)
                    break
                raise ConfigError(
                    f"journal {self.path} is corrupt at line {number}: {error}; it cannot be "
                    "replayed (delete it to start the loader afresh)"
                ) from error
            kept += len(line) + 1
        return entries, min(kept, len(data))  # (a last line may lack its newline)


def actor_was_restarted() -> bool:
    """Whether Ray restarted this actor (`max_restarts`): its journal is then replayed.
    Ray's property reads the actor id through an attribute it has itself deprecated; its
    warning would reach every loader's log as if rayshard used that attribute, so it is
    silenced here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def default_path(namespace: str, name: str) -> str:
    """The default journal: a file in this user's folder in the temp folder, named by cluster
    (GCS address), namespace (one job), loader, and a hash of the three exactly: never shared."""
    try:
        cluster = ray.get_runtime_context().gcs_address or "local"
    except Exception:  # noqa: BLE001 - no cluster address known: one local cluster
        cluster = "local"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{cluster}-{namespace}-{name}")
    safe += "-" + uuid.uuid5(uuid.NAMESPACE_URL, repr((cluster, namespace, name))).hex[:16]
    folder = os.path.join(tempfile.gettempdir(), f"rayshard-{os.getuid()}", "journals")
    return os.path.join(folder, f"{safe[-180:]}.jsonl")
