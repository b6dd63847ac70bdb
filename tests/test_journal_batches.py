"""The journal writes a batch of commands (a relay's groups, answered together) once, at
the batch's end, and each command outside a batch at once; a closed journal writes
nothing more (real files, no Ray)."""

from __future__ import annotations

import json

import pytest

from rayshard.runtime.journal import Journal


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_batch_is_written_at_its_end_and_single_entries_at_once(tmp_path):
    path = tmp_path / "loader.jsonl"
    journal = Journal(str(path), "loader-1")
    journal.start_fresh()
    journal.append({"op": "ack", "n": 0})
    assert [e.get("n") for e in _lines(path)] == [None, 0]  # the header, then the entry
    with journal.batched():
        journal.append({"op": "ack", "n": 1})
        journal.append({"op": "ack", "n": 2})
        assert len(_lines(path)) == 2  # not written yet: the batch is answered together
    assert [e.get("n") for e in _lines(path)] == [None, 0, 1, 2]
    journal.append({"op": "ack", "n": 3})  # after a batch: at once again
    assert _lines(path)[-1] == {"op": "ack", "n": 3}
    assert [e["n"] for e in journal.replay()] == [0, 1, 2, 3]


def test_a_closed_journal_writes_nothing_more_and_a_removed_one_stays_gone(tmp_path):
    """`close(remove=...)` (`Loader.shutdown`, before the coordinator is killed): no entry,
    batch or compaction after it writes the file, so a removed default journal is not made
    again by a last call the coordinator still handles; a kept one keeps what it held."""
    kept, removed = tmp_path / "user.jsonl", tmp_path / "default.jsonl"
    for path in (kept, removed):
        journal = Journal(str(path), "loader-1")
        journal.start_fresh()
        journal.append({"op": "ack", "n": 0})
        journal.close(remove=path == removed)
        journal.append({"op": "ack", "n": 1})
        with journal.batched():
            journal.append({"op": "ack", "n": 2})
        journal.compact({"epoch": 3})
    assert not removed.exists() and not (tmp_path / "default.jsonl.compact").exists()
    assert [e.get("n") for e in _lines(kept)] == [None, 0]


@pytest.mark.parametrize("tail", ['{"op":"ack","n":', '{"op":"ack","n":9}'])
def test_a_restart_after_a_torn_or_unended_last_line_keeps_every_later_entry(tmp_path, tail):
    """A crash in a write leaves a torn last line (dropped) or a whole one without its
    newline (kept): either way the entries the restarted coordinator appends are replayed
    by the next restart (the next entry was glued onto the tail: dropped as torn, or the
    journal refused as corrupt)."""
    path = tmp_path / "loader.jsonl"
    journal = Journal(str(path), "loader-1")
    journal.start_fresh()
    journal.append({"op": "ack", "n": 0})
    with path.open("a") as handle:
        handle.write(tail)  # the crash
    kept = [0] if tail.endswith(":") else [0, 9]
    restarted = Journal(str(path), "loader-1")
    assert [e["n"] for e in restarted.replay()] == kept
    restarted.append({"op": "ack", "n": 1})
    restarted.append({"op": "ack", "n": 2})
    again = Journal(str(path), "loader-1")
    assert [e["n"] for e in again.replay()] == [*kept, 1, 2]


def test_a_journal_of_its_header_alone_without_a_newline_replays_and_appends(tmp_path):
    path = tmp_path / "loader.jsonl"
    Journal(str(path), "loader-1").start_fresh()
    path.write_text(path.read_text().rstrip("\n"))
    journal = Journal(str(path), "loader-1")
    assert list(journal.replay()) == []
    journal.append({"op": "ack", "n": 1})
    assert [e["n"] for e in Journal(str(path), "loader-1").replay()] == [1]
